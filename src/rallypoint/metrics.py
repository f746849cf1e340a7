"""Prometheus metrics of one sidecar, in its own registry (never the process-global one)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

from rallypoint import __version__
from rallypoint.core.jobs import CAUSES

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

__all__ = ["Family", "Metrics", "Sample", "content_type"]


def content_type() -> str:
    """The Content-Type of render()'s output (it follows the installed prometheus_client)."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST

    return CONTENT_TYPE_LATEST


class Sample:
    """One labelled counter or gauge: a plain number, read by the registry at scrape time."""

    __slots__ = ("_family", "_value")

    def __init__(self, family: Family) -> None:
        self._family = family
        self._value = 0.0

    def inc(self, amount: float = 1) -> None:
        """Add amount (counters: never negative, as prometheus_client insists)."""
        if amount < 0 and self._family.kind == "counter":
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self._value += amount

    def set(self, value: float) -> None:
        """Set a gauge's value."""
        if self._family.kind != "gauge":
            raise AttributeError("only a gauge can be set")
        self._value = float(value)


class Family:
    """A metric and its labelled samples, kept in plain numbers and collected at scrape time.

    The middleware counts every request, the first `/livez` included: prometheus_client
    objects would put its import on the path to the first answer, so it is imported only by
    the registry, which reads these numbers when scraped.
    """

    def __init__(
        self, kind: Literal["counter", "gauge"], name: str, doc: str, *labels: str
    ) -> None:
        self.kind = kind
        self.name = name
        self.doc = doc
        self.label_names = labels
        self._samples: dict[tuple[str, ...], Sample] = {}
        if not labels:
            self._samples[()] = Sample(self)

    def labels(self, *values: object) -> Sample:
        """The sample for these label values (made on first use, as prometheus_client does)."""
        if len(values) != len(self.label_names) or not values:
            raise ValueError(f"{self.name}: incorrect label count")
        key = tuple(str(value) for value in values)
        sample = self._samples.get(key)
        if sample is None:
            sample = self._samples[key] = Sample(self)
        return sample

    def remove(self, *values: object) -> None:
        """Drop the series of these label values (a peer that left has none)."""
        self._samples.pop(tuple(str(value) for value in values), None)

    def inc(self, amount: float = 1) -> None:
        """Increment an unlabelled counter."""
        self._unlabelled().inc(amount)

    def set(self, value: float) -> None:
        """Set an unlabelled gauge."""
        self._unlabelled().set(value)

    def _unlabelled(self) -> Sample:
        sample = self._samples.get(())
        if sample is None:
            raise ValueError(f"{self.name} is missing label values")
        return sample

    def collect(self) -> Metric:
        """This family as prometheus_client's exposition sees it, counts as they are now."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        labels = list(self.label_names)
        if self.kind == "gauge":
            gauges = GaugeMetricFamily(self.name, self.doc, labels=labels)
            for key, sample in list(self._samples.items()):
                gauges.add_metric(list(key), sample._value)
            return gauges
        counters = CounterMetricFamily(self.name, self.doc, labels=labels)
        for key, sample in list(self._samples.items()):
            # No `_created` series: one more series per counter that no rule reads.
            counters.add_metric(list(key), sample._value)
        return counters


def counter(name: str, doc: str, *labels: str) -> Family:
    """A family of counters (prometheus_client's Counter, kept in plain numbers)."""
    return Family("counter", name, doc, *labels)


def by_cause(name: str, doc: str) -> Family:
    """A family of counters by job failure cause (core/jobs.CAUSES, the failed states), every
    cause exposed at 0 from the start: increase() sees no rise in a series whose first sample
    is already 1."""
    family = counter(name, doc, "cause")
    for cause in CAUSES:
        family.labels(cause)
    return family


def gauge(name: str, doc: str, *labels: str) -> Family:
    """A family of gauges (prometheus_client's Gauge, kept in plain numbers)."""
    return Family("gauge", name, doc, *labels)


class Metrics:
    """The sidecar's counters and gauges; several instances coexist in one process.

    prometheus_client is imported, and the registry built, on the first render() or value().
    """

    def __init__(self) -> None:
        # Full metric names stay spelled out, so a dashboard's name greps to its definition.
        # Definition order is exposition order (see _families), so the builders run in order.
        self._add_rendezvous_families()
        self._add_probe_families()
        self._add_liveness_families()
        self._request_children: dict[tuple[str, str, int], Sample] = {}
        # Read at scrape time; the sidecar points them at its Mdns and its node.
        #: mDNS rejections by reason.
        self.mdns_rejections: Callable[[], Mapping[str, int]] = dict
        #: The codes of the reasons this node is not ready for (none when ready).
        self.not_ready_codes: Callable[[], Iterable[str]] = tuple
        #: The codes of the slow and lossy links (or nodes) the master names (the master).
        self.link_warning_codes: Callable[[], Iterable[str]] = tuple
        self._registry: CollectorRegistry | None = None

    def _add_rendezvous_families(self) -> None:
        """Who this is, readiness, joins, resolutions, pokes and the HTTP API."""
        self.build_info = gauge(
            "rallypoint_build_info", "Always 1, labelled with this sidecar's version", "version"
        )
        self.build_info.labels(__version__).set(1)
        self.session_info = gauge(
            "rallypoint_session_info",
            "Always 1, labelled with the session and this node's rank once the node list is "
            "known: join on instance to group any series by session",
            "session",
            "rank",
        )
        self.ready = gauge("rallypoint_ready", "1 when /env serves, else 0")
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

    def _add_probe_families(self) -> None:
        """The data-path checks: probes, measured links and relayed batches."""
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
        self.link_throughput = gauge(
            "rallypoint_link_throughput_bytes_per_second",
            "Throughput of each link this node measured, bytes per second, by peer and "
            "direction (up: towards the peer)",
            "peer",
            "direction",
        )
        self.link_retrans = gauge(
            "rallypoint_link_retransmit_ratio",
            "Share of the bytes retransmitted on each link this node measured, by peer and "
            "direction",
            "peer",
            "direction",
        )
        self.link_rtt = gauge(
            "rallypoint_link_rtt_seconds",
            "Smoothed RTT of each link this node measured (TCP_INFO), by peer",
            "peer",
        )
        self.probe_bytes = counter(
            "rallypoint_probe_bytes",
            "Bytes the data-path checks moved, both ends, by direction (sent, received)",
            "direction",
        )
        self.relay_batches = counter(
            "rallypoint_relay_batches",
            "Batches a relay sent the master, by route and result (accepted, a refusal's code, "
            "unreachable, interrupted)",
            "route",
            "result",
        )

    def _add_liveness_families(self) -> None:
        """Clocks (core/clock.py), keep-alives (keepalive.py) and the job (jobwatch.py)."""
        self.clock_offset = gauge(
            "rallypoint_clock_offset_seconds",
            "This node's clock minus the master's, as last measured (0 on the master)",
        )
        self.peer_up = gauge(
            "rallypoint_peer_up",
            "1 while a peer this node watches answers keep-alives (the master watches every "
            "node, a relay its group and upstream, a worker its upstream), 0 once named down, "
            "no series once it left; above 256 nodes only peers that were down have a series",
            "peer",
        )
        self.peers_down = gauge(
            "rallypoint_peers_down", "How many peers this node names down right now"
        )
        self.peers_left = gauge(
            "rallypoint_peers_left",
            "How many peers left on purpose (their sidecar said goodbye) and were not heard since",
        )
        self.jobs = gauge(
            "rallypoint_jobs",
            "How many nodes' jobs are in each state (waiting, running, exited ...), as this "
            "node knows them",
            "state",
        )
        self.job_failures = by_cause(
            "rallypoint_job_failures",
            "Job failures this node heard of, by cause (exited, killed, terminated, lost)",
        )
        self.job_restarts = by_cause(
            "rallypoint_job_restarts",
            "Attempts of the job this node saw start after a failed one, by the failed "
            "attempt's first failure (exited, killed, terminated, lost)",
        )
        self.job_attempt = gauge(
            "rallypoint_job_attempt",
            "The attempt of the job the cluster started last, from 0 (-1: none yet)",
        )
        self.job_attempt.set(-1)

    @property
    def registry(self) -> CollectorRegistry:
        """The Prometheus registry, built (with every count so far) on first use."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry

            registry = CollectorRegistry(auto_describe=True)
            # Registration order is exposition order: the same as when built up front.
            registry.register(_families_collector(self._families()))
            registry.register(_scraped(self))
            self._registry = registry
        return self._registry

    def _families(self) -> list[Family]:
        # Exposition order: as the metrics are defined above.
        return [value for value in vars(self).values() if isinstance(value, Family)]

    def request_counter(self, api: str, route: str, status: int) -> Sample:
        """The rallypoint_http_requests sample for these labels, resolved once and cached.

        Building a label key on every request costs too much; the label sets are few (the
        routes are fixed, statuses a handful).
        """
        key = (api, route, status)
        child = self._request_children.get(key)
        if child is None:
            child = self.requests.labels(api, route, str(status))
            self._request_children[key] = child
        return child

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def value(self, name: str, **labels: str) -> float:
        """One sample's current value (0.0 when absent): for /status and tests."""
        sample = self.registry.get_sample_value(name, labels)
        return 0.0 if sample is None else sample


def _families_collector(families: list[Family]) -> Any:
    """One collector for every family: reads the plain counts at each scrape."""
    from prometheus_client.registry import Collector

    class Families(Collector):
        def collect(self) -> Iterator[Metric]:
            for family in families:
                yield family.collect()

    return Families()


def _scraped(metrics: Metrics) -> Any:
    """The families counted elsewhere and read at each scrape, by label value."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    def family(
        kind: type[CounterMetricFamily | GaugeMetricFamily],
        name: str,
        description: str,
        label: str,
        counts: Mapping[str, int],
    ) -> Metric:
        out = kind(name, description, labels=[label])
        for value, count in sorted(counts.items()):
            out.add_metric([value], count)
        return out

    class Scraped(Collector):
        def collect(self) -> Iterator[Metric]:
            yield family(
                CounterMetricFamily,
                "rallypoint_mdns_rejected",
                "mDNS announcements dropped, by reason (malformed, session, host, signature)",
                "reason",
                metrics.mdns_rejections(),
            )
            yield family(
                GaugeMetricFamily,
                "rallypoint_not_ready_reasons",
                "How many reasons this node is not ready for, by code (deadline_exceeded, "
                "path_mtu ...: docs/readiness.md); no series while ready",
                "code",
                Counter(metrics.not_ready_codes()),
            )
            yield family(
                GaugeMetricFamily,
                "rallypoint_link_warnings",
                "Slow or lossy links and nodes the master names now, by code (slow_link, "
                "lossy_link); the master only",
                "code",
                Counter(metrics.link_warning_codes()),
            )

    return Scraped()
