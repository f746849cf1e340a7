"""A healthy node warns of nothing it does not have: every warning a healthy single node
and a healthy 3-node cluster show is held to an empty list, and a fine verdict explained
says why it is fine, with no remedy."""

from __future__ import annotations

import logging

import pytest

from rallypoint.cli.status import format_status
from rallypoint.sidecar import Sidecar
from tests.support.cluster.inprocess import ready_cluster
from tests.support.ports import free_port
from tests.support.settings import fast_settings
from tests.support.shown import status_view

AUTH_WARNING = "peer messages are not authenticated: set RALLYPOINT_TOKEN on every node"
#: No throughput measurement: three nodes of one event loop share loopback, which retransmits
#: when the machine is starved (tests/inprocess/test_datapath.py); the namespace tier
#: (tests/monitoring) holds a healthy cluster's warnings, links measured, to none.
NO_LINK_NOISE = {rank: {"throughput": False} for rank in range(3)}


async def test_a_single_node_without_a_token_warns_of_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    settings = fast_settings(local_port=free_port(), peer_port=free_port())
    async with Sidecar(settings, {}) as sidecar:  # no cluster variables: the single provider
        node = sidecar.node
        assert await node.readiness.wait_ready(20)
        assert node.spec.provider == "single"
        assert node.readiness.warnings() == []
        doc = node.status()
        assert doc["warnings"] == []
        (own,) = doc["peers"]  # type: ignore[misc]
        assert own["verdict"] == "loopback" and own["excused"].startswith("a single node")
        explained = format_status(status_view(doc), explain=True)
    assert [r.message for r in caplog.records if r.levelno >= logging.WARNING] == []
    # Explained, the fine verdict says what the lookup found and why that is fine: no remedy.
    assert "loopback (fine)" in explained
    assert "fine: a single node: no peer dials this name" in explained
    assert "resolves to loopback" in explained
    assert "map the name" not in explained and "/etc/hosts" not in explained


async def test_a_healthy_three_node_cluster_warns_of_nothing() -> None:
    async with ready_cluster(3, token="healthy-secret", per_node=NO_LINK_NOISE) as cluster:
        for rank, sidecar in cluster.nodes.items():
            assert sidecar.node.readiness.warnings() == [], rank
            assert sidecar.node.status()["warnings"] == [], rank


async def test_a_cluster_without_a_token_is_told_so_on_every_node() -> None:
    async with ready_cluster(3, per_node=NO_LINK_NOISE) as cluster:
        for rank, sidecar in cluster.nodes.items():
            assert sidecar.node.readiness.warnings() == [AUTH_WARNING], rank
