"""A node's own name on a loopback address: fatal, or a warning when an interface is served.

Sidecars of one session in one event loop on loopback ports (tests/support/cluster/inprocess.py),
and the judgement itself (core/names.py) from a table.
"""

from __future__ import annotations

import pytest

from rallypoint import wire
from rallypoint.core.names import Resolution, Verdict, judge_own
from rallypoint.model import ClusterSpec
from rallypoint.net import netinfo
from rallypoint.rendezvous.checks import namecheck as verify
from rallypoint.sidecar import Sidecar
from tests.support.cluster.inprocess import (
    SESSION,
    address,
    all_ready,
    cluster,
    codes,
    start_all,
    until,
)
from tests.support.settings import fast_settings


async def test_own_name_on_loopback_names_the_address_and_the_remedies() -> None:
    async with cluster(3, per_node={2: {"emit_ifname": False}}) as c:
        c.resolvers[2].set("node2", ["127.0.1.1"])
        await start_all(c)
        await until(lambda: "self_loopback" in codes(c.nodes[2]))
        reason = next(r for r in c.nodes[2].node.readiness.reasons() if r.code == "self_loopback")
        for needle in ("node2", "127.0.1.1", "/etc/hosts", "--no-emit-ifname", "docs/loopback.md"):
            assert needle in reason.message, reason.message
        assert c.nodes[2].node.readiness.env is None


@pytest.mark.parametrize("emit", [None, True], ids=["default", "emit-ifname"])
async def test_own_name_on_loopback_with_served_ifname_depends_on_the_route(
    emit: bool | None,
) -> None:
    """By default the node is ready with a warning iff a route to the master exists;
    NCCL_SOCKET_IFNAME is served only with --emit-ifname."""
    routed = netinfo.route_ifname(address(0))
    async with cluster(3, per_node={2: {"emit_ifname": emit}}) as c:
        c.resolvers[2].set("node2", ["127.0.1.1"])
        await start_all(c)
        if routed is None:  # no route to the documentation address on this host
            await until(lambda: "self_loopback" in codes(c.nodes[2]))
            reason = next(
                r for r in c.nodes[2].node.readiness.reasons() if r.code == "self_loopback"
            )
            assert "no interface that routes to the master was found" in reason.message
            return
        await all_ready(c)
        node = c.nodes[2].node
        env = node.readiness.env
        assert env is not None and env.get("GLOO_SOCKET_IFNAME") == routed
        assert env.get("NCCL_SOCKET_IFNAME") == (routed if emit else None)
        warnings = node.readiness.warnings()
        assert any("node2" in w and "127.0.1.1" in w and routed in w for w in warnings)
        assert node.status()["warnings"] == warnings
        assert not any("loopback" in w for w in c.nodes[1].node.readiness.warnings())


@pytest.mark.parametrize("resolved", [0, 1], ids=["first-reported", "second-reported"])
async def test_the_route_served_is_the_one_to_the_masters_verified_address(
    resolved: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GLOO_SOCKET_IFNAME is the interface routing to the master's verified address: the
    reported address its name resolves to, not merely the first one it reported."""
    reported = [address(0), "198.51.100.99"]

    def facts(master_ip: str | None) -> wire.NetFacts:
        return wire.NetFacts(ifname=f"via-{master_ip}", mtu=1500, rdma=False)

    monkeypatch.setattr(verify, "net_facts", facts)
    async with cluster(2, addresses={0: reported}) as c:
        c.resolvers[1].set("node0", [reported[resolved]])
        await start_all(c)
        await all_ready(c)
        env = c.nodes[1].node.readiness.env
        assert env is not None and env.get("GLOO_SOCKET_IFNAME") == f"via-{reported[resolved]}"


def _own(verdict: Verdict, *addresses: str) -> Resolution:
    return Resolution("node2", verdict, addresses, f"node2 answers {addresses}", 1, 0.0)


@pytest.mark.parametrize(
    ("own", "changes", "accept", "ifname", "code", "needles"),
    [
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {"emit_ifname": False}, False, None,
         "self_loopback",
         ("node2", "127.0.1.1", "/etc/hosts", "drop --no-emit-ifname", "docs/loopback.md")),
        (_own(Verdict.LOOPBACK, "10.0.0.2", "127.0.1.1"), {"emit_ifname": False}, False, None,
         "self_loopback", ("(127.0.1.1)",)),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {}, False, None,
         "self_loopback", ("127.0.1.1", "no interface that routes", "/etc/hosts")),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {}, False, "eth0", None,
         ("node2", "127.0.1.1", "eth0", "GLOO_SOCKET_IFNAME")),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {"emit_ifname": True}, False, "eth0", None,
         ("node2", "127.0.1.1", "eth0", "GLOO_SOCKET_IFNAME")),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {"emit_ifname": True, "strict_self": True}, False,
         "eth0", "strict_self", ("node2", "127.0.1.1", "--strict-self")),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {"strict_self": True}, True, None, None, ()),
        (_own(Verdict.LOOPBACK, "127.0.1.1"), {}, True, None, None, ()),
        (_own(Verdict.OK, "198.51.100.12"), {"strict_self": True}, False, None, None, ()),
        (_own(Verdict.NOT_FOUND), {}, False, None, None, ("node2", "does not check out")),
        (_own(Verdict.NOT_FOUND), {"strict_self": True}, False, None, "strict_self", ("node2",)),
    ],
    ids=[
        "loopback", "loopback-among-answers", "default-without-route", "default-with-route",
        "emit-ifname-with-route", "strict-self-beats-emit-ifname", "accepted-even-strict",
        "accepted", "ok", "not-found-warns", "not-found-strict",
    ],
)  # fmt: skip
def test_own_name_judgement(
    own: Resolution,
    changes: dict[str, object],
    accept: bool,
    ifname: str | None,
    code: str | None,
    needles: tuple[str, ...],
) -> None:
    reason, warning = judge_own(
        own, fast_settings(**changes).own_name_rules(), accept_loopback=accept, ifname=ifname
    )
    assert (reason.code if reason else None) == code
    if reason is not None:
        assert warning is None and reason.host == "node2"
    text = reason.message if reason is not None else warning
    if not needles:
        assert text is None
    else:
        assert text is not None and all(needle in text for needle in needles), text


async def test_a_user_gloo_socket_ifname_keeps_an_own_name_on_loopback_a_warning() -> None:
    """gloo binds the user's GLOO_SOCKET_IFNAME too, so it rescues the node like --emit-ifname."""
    async with cluster(3) as c:
        c.resolvers[2].set("node2", ["127.0.1.1"])
        await c.start(0)
        await c.start(1)
        spec = ClusterSpec("explicit", c.hosts, 2, 3, SESSION)
        sidecar = Sidecar(
            c.settings(2),
            {"GLOO_SOCKET_IFNAME": "ib0"},
            resolver=c.resolvers[2],
            spec=spec,
            addresses=[address(2)],
            endpoint=c.endpoint,
            route=c.route,
        )
        await sidecar.start()
        c.nodes[2] = sidecar
        await all_ready(c)
        readiness = sidecar.node.readiness
        assert readiness.env is not None
        assert readiness.env.get("GLOO_SOCKET_IFNAME") == "ib0"
        assert any("127.0.1.1" in w and "ib0" in w for w in readiness.warnings())
