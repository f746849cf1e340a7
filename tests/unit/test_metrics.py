"""Metrics count in plain numbers; the registry, built on the first scrape, exposes the same."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from rallypoint import __version__
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
    return metrics.render().decode()


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


def test_counters_have_no_created_series_and_the_version_is_exposed() -> None:
    metrics = Metrics()
    metrics.joins.labels("accepted").inc()
    text = metrics.render().decode()
    assert "_created" not in text
    assert f'rallypoint_build_info{{version="{__version__}"}} 1.0' in text
    metrics.session_info.labels("sess-1", 2).set(1)
    assert metrics.value("rallypoint_session_info", session="sess-1", rank="2") == 1


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
from rallypoint import __version__
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


def test_docs_api_lists_every_metric_the_sidecar_exposes() -> None:
    metrics = Metrics()
    for family in vars(metrics).values():
        if getattr(family, "label_names", None):
            family.labels(*("x" for _ in family.label_names))
    metrics.mdns_rejections = lambda: {"session": 1}
    metrics.not_ready_codes = lambda: ["x"]
    metrics.link_warning_codes = lambda: ["x"]
    exposed = set(re.findall(r"^# TYPE (\S+) (\S+)", metrics.render().decode(), re.M))
    api = (Path(__file__).parents[2] / "docs" / "api.md").read_text()
    listed = set(re.findall(r"^\| `(rallypoint_[a-z_]+)`", api, re.M))
    listed |= set(re.findall(r"`(rallypoint_[a-z_]+)`", api))
    names = {name + ("_total" if kind == "counter" and not name.endswith("_total") else "")
             for name, kind in exposed}  # fmt: skip
    assert len(names) > 30 and names <= listed, sorted(names - listed)
