"""Fixtures for the monitoring tier: promtool, and namespace clusters that a Prometheus of
the test's own scrapes, torn down whatever the test does."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.conftest import has_failed, require
from tests.monitoring import prom
from tests.support.cluster.build import Cluster
from tests.support.cluster.layout import FAST_ARGS
from tests.support.cluster.runs import close_all, prerequisites, sweep_stale

#: The session secret every sidecar of a test cluster shares (peer messages are signed).
TOKEN = "monitoring-test-secret"
#: The metrics listener's port on every node (--metrics-port).
METRICS_PORT = 7782
#: After ready, a keep-alive every second: a dead peer is named within about 5 s.
KEEPALIVE_S = 1.0
SIDECAR_ARGS = (
    *FAST_ARGS,
    "--metrics-port", str(METRICS_PORT),
    "--keepalive", f"{KEEPALIVE_S:g}",
    "--probe-timeout", "1",
    "--frameworks", "torch",
)  # fmt: skip


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path; skipped locally (failed in CI) without it."""
    path = shutil.which("promtool")
    require(path is not None, "promtool is not on PATH (apt-get install prometheus)")
    assert path is not None
    return path


@pytest.fixture(scope="session")
def netns_session() -> Iterator[str | None]:
    """Why namespace clusters or Prometheus cannot run here (None: they can); sweeps dead runs."""
    reason = prerequisites() or prom.prerequisites()
    if reason is None:
        sweep_stale()
    yield reason
    close_all()


class Monitored(NamedTuple):
    """A namespace cluster (sidecars not started) and the Prometheus that scrapes it."""

    cluster: Cluster
    prometheus: prom.Prometheus


MakeMonitored = Callable[[Sequence[str]], Monitored]


@pytest.fixture
def make_monitored(
    netns_session: str | None, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[MakeMonitored]:
    """Factory: make_monitored(hosts) -> a cluster on its bridge and a running Prometheus
    scraping every node's metrics listener with the shipped rules."""
    require(netns_session is None, f"monitoring tier: {netns_session}")
    made: list[Monitored] = []

    def make(hosts: Sequence[str]) -> Monitored:
        workdir = tmp_path / f"cluster{len(made)}"
        cluster = Cluster(
            hosts, workdir, sidecar_args=SIDECAR_ARGS, sidecar_env={"RALLYPOINT_TOKEN": TOKEN}
        )
        targets = [f"{host}:{METRICS_PORT}" for host in hosts]
        prometheus = prom.Prometheus(cluster, workdir / "prometheus", targets)
        made.append(Monitored(cluster, prometheus))
        cluster.up()
        prometheus.start()
        return made[-1]

    yield make
    failed = has_failed(request.node)
    for cluster, prometheus in made:
        if failed:
            print(f"==== logs of {cluster.id} ({cluster.workdir})")
            print(cluster.logs())
            print(f"---- prometheus ----\n{prometheus.log()}")
        prometheus.close()
        cluster.close()
