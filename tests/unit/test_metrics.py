"""Metrics count in plain numbers; the registry, built on the first scrape, exposes the same."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from rallypoint.metrics import Metrics


def _count(metrics: Metrics) -> None:
    metrics.ready.set(1)
    metrics.ready_transitions.labels("ready").inc()
    metrics.joins.labels("accepted").inc(3)
    metrics.resolutions.labels("ok")  # made, never incremented: exposed as 0
    metrics.request_counter("local", "/livez", 200).inc()
    metrics.pokes_received.inc()
    metrics.mdns_rejections = lambda: {"session": 2}


def _exposition(metrics: Metrics) -> str:
    # _created holds the wall clock when a sample was made: equal only up to that.
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", metrics.render().decode())


def test_counts_made_before_the_first_scrape_are_exposed_as_if_counted_after() -> None:
    early = Metrics()
    _count(early)
    late = Metrics()
    late.render()  # the registry exists before anything is counted
    _count(late)
    assert _exposition(early) == _exposition(late)
    assert 'rallypoint_joins_total{result="accepted"} 3.0' in _exposition(early)
    assert 'rallypoint_resolutions_total{verdict="ok"} 0.0' in _exposition(early)
    assert 'rallypoint_mdns_rejected_total{reason="session"} 2.0' in _exposition(early)


def test_counting_goes_on_after_the_first_scrape() -> None:
    metrics = Metrics()
    counter = metrics.request_counter("local", "/env", 200)
    counter.inc()
    assert (
        metrics.value("rallypoint_http_requests_total", api="local", route="/env", status="200")
        == 1
    )
    counter.inc()
    metrics.joins.labels("rejected").inc()  # a label set first seen after the scrape
    metrics.ready.set(1)
    assert (
        metrics.value("rallypoint_http_requests_total", api="local", route="/env", status="200")
        == 2
    )
    assert metrics.value("rallypoint_joins_total", result="rejected") == 1
    assert metrics.value("rallypoint_ready") == 1


def test_the_created_time_is_the_samples_not_the_scrapes() -> None:
    metrics = Metrics()
    metrics.joins.labels("accepted").inc()
    made = metrics.joins.labels("accepted")._created
    assert metrics.value("rallypoint_joins_created", result="accepted") == made


@pytest.mark.parametrize("registry_first", [False, True])
def test_counters_refuse_what_prometheus_client_refuses(registry_first: bool) -> None:
    metrics = Metrics()
    if registry_first:
        metrics.render()
    with pytest.raises(ValueError, match="non-negative"):
        metrics.joins.labels("accepted").inc(-1)
    with pytest.raises(ValueError):
        metrics.joins.labels("accepted", "extra")
    with pytest.raises(ValueError):
        metrics.pokes_received.labels("unexpected")
    with pytest.raises(ValueError):
        metrics.joins.inc()  # a labelled counter has no unlabelled sample


PROBE = """
import sys
from rallypoint.metrics import Metrics
m = Metrics()
m.request_counter("local", "/livez", 200).inc()
m.ready.set(1)
before = "prometheus_client" in sys.modules
m.render()
print(before, "prometheus_client" in sys.modules)
"""


def test_prometheus_client_is_imported_on_the_first_scrape() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    assert out.split() == ["False", "True"]
