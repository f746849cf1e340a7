"""Fixtures for tier 3: namespace clusters that are torn down whatever the test does."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.conftest import has_failed, require
from tests.multihost import clients
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.layout import FAST_ARGS, SUBNET
from tests.support.cluster.nodes import Node
from tests.support.cluster.runs import close_all, prerequisites, sweep_stale

#: The session secret every sidecar of a test cluster shares (peer messages are signed).
TOKEN = "multihost-test-secret"
#: Backend.AI lists hosts in no promised order; the master is listed second on purpose.
HOSTS = ("sub1", "main1", "sub2")


@pytest.fixture(scope="session")
def netns_session() -> Iterator[str | None]:
    """Check the prerequisites once (the reason they fail, or None) and sweep dead runs."""
    reason = prerequisites()
    if reason is None:
        sweep_stale()
    yield reason
    close_all()


@pytest.fixture
def make_cluster(
    netns_session: str | None, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[MakeCluster]:
    """Factory: make_cluster(hosts=HOSTS, args=(), env=None, family="ipv4") -> an up Cluster."""
    require(netns_session is None, f"multi-host tier: {netns_session}")
    made: list[Cluster] = []

    def make(
        hosts: Sequence[str] = HOSTS,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        family: str = "ipv4",
        environ_for: Callable[[Cluster, Node], Mapping[str, str]] | None = None,
        subnet: str = SUBNET,
    ) -> Cluster:
        extra = {"RALLYPOINT_TOKEN": TOKEN, **(env or {})}
        cluster = Cluster(
            hosts,
            tmp_path / f"cluster{len(made)}",
            sidecar_args=(*FAST_ARGS, *args),
            sidecar_env=extra,
            family=family,
            environ_for=environ_for,
            subnet=subnet,
        )
        made.append(cluster)
        cluster.up()
        return cluster

    yield make
    failed = has_failed(request.node)
    for cluster in made:
        if failed:
            print(f"==== logs of {cluster.id} ({cluster.workdir})")
            print(cluster.logs())
        cluster.close()


@pytest.fixture
def cluster(make_cluster: MakeCluster) -> Cluster:
    """The default three-node Backend.AI cluster, sidecars not started yet."""
    return make_cluster()


@pytest.fixture
def torch_script() -> Path:
    """The real-client script; requires PyTorch (pip install torch==2.13.0)."""
    require(
        importlib.util.find_spec("torch") is not None,
        "PyTorch is not installed (pip install torch==2.13.0)",
    )
    return clients.ALLREDUCE
