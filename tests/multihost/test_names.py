"""Name faults injected through one node's hosts file: late names, names on loopback."""

from __future__ import annotations

import time

import pytest

from tests.support.cluster.build import Cluster
from tests.support.cluster.nodes import Node
from tests.support.netns import IFNAME, wait_for

pytestmark = pytest.mark.multihost

READY_S = 30.0
#: How long a fault is held before it is repaired: long enough to see the node refuse.
FAULT_S = 4.0


def _not_ready_naming(node: Node, *needles: str, timeout_s: float = 15.0) -> str:
    """Wait until node answers not ready with every needle in its reasons; return them."""

    def probe() -> str | None:
        reply = node.readyz()
        if reply is None or reply.status != 503:
            return None
        reasons = node.reasons()
        return reasons if all(needle in reasons for needle in needles) else None

    return wait_for(
        probe, timeout_s=timeout_s, what=f"{node.name} not ready naming {needles}",
        describe=node.describe,
    )  # fmt: skip


def _hold_not_ready(node: Node, seconds: float) -> None:
    """Assert node stays not ready for the given time (it must not serve a broken env)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert not node.is_ready(), f"{node.name} turned ready during the fault: {node.env()}"
        time.sleep(0.2)


@pytest.mark.parametrize("missing", ["main1", "sub2"], ids=["master-missing", "peer-missing"])
def test_late_name_makes_the_node_wait_then_ready(cluster: Cluster, missing: str) -> None:
    victim = cluster["sub1"]
    victim.drop_host(missing)
    cluster.start_all()

    _not_ready_naming(victim, missing)
    _hold_not_ready(victim, FAULT_S)

    victim.unpin()  # the name appears, as when a DNS record is published late
    served = cluster.wait_all_ready(READY_S)
    assert served["sub1"]["MASTER_ADDR"] == "main1"
    assert len({env["RALLYPOINT_GENERATION"] for env in served.values()}) == 1


def test_master_name_on_loopback_at_a_worker_is_fatal_there(cluster: Cluster) -> None:
    victim = cluster["sub1"]
    victim.pin("main1", "127.0.1.1")
    cluster.start_all()

    _not_ready_naming(victim, "main1", "127.0.1.1")
    _hold_not_ready(victim, FAULT_S)
    assert victim.env() is None

    victim.unpin()
    cluster.wait_all_ready(READY_S)


@pytest.mark.parametrize("node", ["sub1", "main1"])
@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("--no-emit-ifname",), "self_loopback"),
        (("--emit-ifname", "--strict-self"), "strict_self"),
    ],
    ids=["no-emit-ifname", "strict-self-with-emit-ifname"],
)
def test_own_name_on_loopback_is_fatal_without_a_pinned_interface(
    cluster: Cluster, node: str, args: tuple[str, ...], code: str
) -> None:
    # Fatal for the measured reason (docs/loopback.md): gloo publishes what its own name
    # resolves to. --strict-self stays fatal with an interface, for stacks that ignore it.
    cluster[node].pin(node, "127.0.1.1")
    cluster.start_all(args)

    _not_ready_naming(cluster[node], code, node, "127.0.1.1")
    _hold_not_ready(cluster[node], FAULT_S)
    assert cluster[node].env() is None
    # The cluster-wide verdict: no other node serves an env while this one cannot.
    for other in cluster:
        if other.name != node:
            _not_ready_naming(other, code, node, "127.0.1.1")
    cluster[node].unpin()
    cluster.wait_all_ready(READY_S)


@pytest.mark.parametrize("node", ["sub1", "main1"])
@pytest.mark.parametrize("args", [(), ("--emit-ifname",)], ids=["default", "emit-ifname"])
def test_own_name_on_loopback_with_a_served_ifname_is_a_warning(
    cluster: Cluster, node: str, args: tuple[str, ...]
) -> None:
    cluster[node].pin(node, "127.0.1.1")
    cluster.start_all(args)

    served = cluster.wait_all_ready(READY_S)
    warnings = " ".join(cluster[node].status()["warnings"])
    for needle in (node, "127.0.1.1", IFNAME, "GLOO_SOCKET_IFNAME"):
        assert needle in warnings, warnings
    for other in cluster:
        assert served[other.name]["GLOO_SOCKET_IFNAME"] == IFNAME
        if other.name != node:
            assert "127.0.1.1" not in " ".join(other.status()["warnings"])
