"""Prometheus metrics of one sidecar, in its own registry (never the process-global one)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The sidecar's counters and gauges; several instances coexist in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        # Full metric names stay spelled out, so a dashboard's name greps to its definition.
        def counter(name: str, description: str, *labels: str) -> Counter:
            return Counter(name, description, labels, registry=r)

        self.ready = Gauge("rallypoint_ready", "1 when /env serves, else 0", registry=r)
        self.ready_transitions = counter(
            "rallypoint_ready_transitions", "Readiness changes, by new state", "to"
        )
        self.generation_changes = counter(
            "rallypoint_generation_changes", "Cluster documents with a new generation acted on"
        )
        self.joins = counter(
            "rallypoint_joins", "Join requests answered (master), by result", "result"
        )
        self.join_attempts = counter(
            "rallypoint_join_attempts", "Join attempts made (worker), by result", "result"
        )
        self.auth_failures = counter(
            "rallypoint_auth_failures", "Peer messages rejected by authentication", "reason"
        )
        self.resolutions = counter(
            "rallypoint_resolutions", "Host name resolutions, by verdict", "verdict"
        )
        self.requests = counter(
            "rallypoint_http_requests", "HTTP requests served", "api", "route", "status"
        )
        self.pokes_received = counter("rallypoint_pokes_received", "Pokes accepted from the master")
        self.pokes_sent = counter(
            "rallypoint_pokes_sent", "Pokes sent to workers, by result", "result"
        )
        self.mdns_wakeups = counter(
            "rallypoint_mdns_wakeups",
            "Join backoffs cut short because mDNS showed the master start or change generation",
        )
        self.probes_sent = counter(
            "rallypoint_probes_sent",
            "Connection probes made to peers' ports, by kind and cause (ok, timeout ...)",
            "kind",
            "cause",
        )
        self.probes_answered = counter(
            "rallypoint_probes_answered",
            "Connections to this node's probe windows, by result (answered, garbage ...)",
            "result",
        )
        self._request_children: dict[tuple[str, str, int], Counter] = {}
        #: mDNS rejections by reason, read at scrape time (the sidecar points it at its Mdns).
        self.mdns_rejections: Callable[[], Mapping[str, int]] = dict
        r.register(_MdnsRejections(self))

    def request_counter(self, api: str, route: str, status: int) -> Counter:
        """The rallypoint_http_requests child for these labels, resolved once and cached.

        ``labels()`` takes a lock and builds a key on every call: too much per request.
        The label sets are few (the routes are fixed, statuses a handful).
        """
        key = (api, route, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(api, route, str(status))
            self._request_children[key] = child
        return child

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """One sample's current value (0.0 when absent): for /status and tests."""
        sample = self.registry.get_sample_value(name, labels)
        return 0.0 if sample is None else sample


class _MdnsRejections(Collector):
    """rallypoint_mdns_rejected_total{reason}: counted by mdns/browse.py, exposed at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "rallypoint_mdns_rejected",
            "mDNS announcements dropped, by reason (malformed, session, host, signature)",
            labels=["reason"],
        )
        for reason, count in sorted(self._metrics.mdns_rejections().items()):
            family.add_metric([reason], count)
        yield family
