"""Several sidecars in one event loop on loopback ports, each with its own in-memory resolver.

Peer addressing: every node's name resolves (in its own FakeResolver) to a documentation
address 198.51.100.x, and the endpoint seam maps (host, address) to 127.0.0.1 and that
host's own peer port, so resolution verdicts stay realistic while traffic stays on loopback.
One test uses the plain scheme instead (names -> 127.0.0.x, one shared peer port).
"""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest

from rallypoint.errors import ConfigError, PortError
from rallypoint.model import ClusterSpec
from rallypoint.net import ports
from rallypoint.sidecar import Sidecar
from tests.fakes import FakeResolver
from tests.support.cluster.inprocess import (
    SESSION,
    Cluster,
    address,
    all_ready,
    cluster,
    codes,
    ready_cluster,
    restart,
    start_all,
    tried_the_master,
    until,
)
from tests.support.ports import free_port
from tests.support.settings import fast_settings


async def test_three_nodes_agree_on_the_rendezvous() -> None:
    async with ready_cluster(3) as c:
        served = {r: s.node.readiness.env for r, s in c.nodes.items()}
        envs = {r: env.as_dict() for r, env in served.items() if env}
        master_port = c.nodes[0].node.held["master"].port
        for rank, env in envs.items():
            assert env["NODE_RANK"] == str(rank)
            assert env["RANK"] == str(rank)
            assert env["MASTER_ADDR"] == "node0"
            assert env["MASTER_PORT"] == str(master_port)
            assert env["WORLD_SIZE"] == "3"
            tf = json.loads(env["TF_CONFIG"])
            assert tf["task"] == {"type": "worker", "index": rank}
        clusters = {json.dumps(json.loads(e["TF_CONFIG"])["cluster"]) for e in envs.values()}
        assert len(clusters) == 1
        workers = json.loads(next(iter(clusters)))["worker"]
        tf_ports = [c.nodes[r].node.held["tf"].port for r in range(3)]
        assert workers == [f"node{r}:{tf_ports[r]}" for r in range(3)]
        generations = {s.node.verification.generation for s in c.nodes.values()}
        assert len(generations) == 1 and None not in generations


async def test_names_on_127_addresses_with_one_peer_port() -> None:
    """The plain scheme: names -> 127.0.0.x, one peer port, each node on its own address."""
    hosts = ("a0", "a1", "a2")
    resolver = FakeResolver({h: [f"127.0.0.{r + 2}"] for r, h in enumerate(hosts)})
    peer_port = free_port("127.0.0.2")
    sidecars = []
    try:
        for rank in range(len(hosts)):
            settings = fast_settings(
                local_hosts=(), peer_host=f"127.0.0.{rank + 2}", peer_port=peer_port
            )
            spec = ClusterSpec("explicit", hosts, rank, 3, SESSION, loopback_ok=True)
            sidecar = Sidecar(
                settings, {}, resolver=resolver, spec=spec, addresses=[f"127.0.0.{rank + 2}"]
            )
            await sidecar.start()
            sidecars.append(sidecar)
        assert all(await asyncio.gather(*(s.node.readiness.wait_ready(20) for s in sidecars)))
        served = [s.node.readiness.env for s in sidecars]
        assert {env.get("MASTER_ADDR") for env in served if env} == {"a0"}
    finally:
        for sidecar in reversed(sidecars):
            await sidecar.stop()


@pytest.mark.parametrize(
    ("answers", "settings", "code"),
    [
        ({"node1": None}, {}, "resolve_failed"),
        ({"node1": ["127.0.1.1"]}, {}, "loopback_peer"),
        ({"node1": ["198.51.100.99"]}, {}, "address_mismatch"),
        ({"node2": ["127.0.1.1"]}, {"strict_self": True}, "strict_self"),
        ({"node2": ["127.0.1.1"]}, {"emit_ifname": False}, "self_loopback"),
    ],
    ids=["not-found", "loopback-peer", "mismatch", "strict-self", "self-loopback"],
)
async def test_resolution_failures_keep_the_cluster_not_ready(
    answers: dict[str, list[str] | None], settings: dict[str, object], code: str
) -> None:
    """A name failure on node2 keeps node2 not ready, and with it the whole cluster:
    every node shows node2's reason (the cluster-wide verdict, docs/readiness.md)."""
    async with cluster(3, per_node={2: settings}) as c:
        for host, answer in answers.items():
            if answer is None:
                c.resolvers[2].remove(host)
            else:
                c.resolvers[2].set(host, answer)
        await start_all(c)
        await until(lambda: all(code in codes(s) for s in c.nodes.values()))
        for rank, sidecar in c.nodes.items():
            readiness = sidecar.node.readiness
            assert not readiness.ready
            reason = next(r for r in readiness.reasons() if r.code == code)
            assert reason.host == next(iter(answers))
            if rank != 2:
                assert reason.message.startswith("node2 reports: "), reason.message
            async with aiohttp.ClientSession() as http, http.get(c.local_url(rank, "/env")) as resp:
                assert resp.status == 503
                body = await resp.json()
            assert code in {r["code"] for r in body["reasons"]}


async def test_peer_name_that_appears_late() -> None:
    async with cluster(3) as c:
        c.resolvers[2].set("node1", [address(1)], appear_after=3)
        await start_all(c)
        await all_ready(c)
        peer = c.nodes[2].node.peers[1]
        assert peer.resolution is not None and peer.resolution.verdict == "ok"
        assert c.resolvers[2].calls["node1"] > 3


async def test_master_restart_is_picked_up_by_workers() -> None:
    async with ready_cluster(3) as c:
        old = await restart(c, 0)
        new = {s.node.verification.generation for s in c.nodes.values()}
        assert len(new) == 1 and old not in new
        for rank in (1, 2):
            metrics = c.nodes[rank].metrics
            assert metrics.value("rallypoint_ready_transitions_total", to="not_ready") >= 1
            assert metrics.value("rallypoint_ready_transitions_total", to="ready") >= 2


async def test_a_late_master_pokes_waiting_workers() -> None:
    """Workers whose backoff pause is an hour become ready: only the poke can wake them."""
    slow = {"backoff_initial_s": 3600.0, "backoff_max_s": 3600.0}
    async with cluster(3, per_node={1: slow, 2: slow}) as c:
        await c.start(1)
        await c.start(2)
        await tried_the_master(c, (1, 2))
        await c.start(0)
        await all_ready(c, timeout_s=60)
        for rank in (1, 2):
            assert c.nodes[rank].metrics.value("rallypoint_pokes_received_total") >= 1


async def test_a_late_worker_joins_on_its_first_attempt() -> None:
    async with cluster(3) as c:
        await c.start(0)
        await c.start(1)
        await until(lambda: c.nodes[0].node.peers[1].joined)
        assert not c.nodes[0].node.readiness.ready
        assert codes(c.nodes[0]) == {"waiting_for_join"}
        assert c.nodes[0].node.readiness.reasons()[0].ranks == (2,)
        await c.start(2)
        await all_ready(c)
        metrics = c.nodes[2].metrics
        assert metrics.value("rallypoint_join_attempts_total", result="accepted") == 1
        assert metrics.value("rallypoint_join_attempts_total", result="master_unreachable") == 0


async def test_a_taken_preferred_port_is_skipped_and_reported() -> None:
    with socket.socket() as thief:
        thief.bind(("0.0.0.0", 0))
        taken = int(thief.getsockname()[1])
        async with ready_cluster(2, per_node={0: {"master_port": taken}}) as c:
            ports = c.nodes[0].node.status()["ports"]
            master = ports["master"]  # type: ignore[index]
            assert master["port"] != taken
            assert [s["port"] for s in master["skipped"]][:1] == [taken]
            env = c.nodes[1].node.readiness.env
            assert env is not None and env.get("MASTER_PORT") == str(master["port"])


async def test_a_taken_user_master_port_is_an_error() -> None:
    with socket.socket() as thief:
        thief.bind(("0.0.0.0", 0))
        taken = int(thief.getsockname()[1])
        settings = fast_settings(local_port=free_port(), peer_port=free_port())
        spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
        sidecar = Sidecar(settings, {"MASTER_PORT": str(taken)}, resolver=FakeResolver(), spec=spec)
        with pytest.raises(PortError, match=f"MASTER_PORT={taken}"):
            await sidecar.start()


async def test_a_user_master_port_on_the_sidecars_own_listener_is_a_config_error() -> None:
    # Held for the job first, it stopped the peer listener with "address already in use".
    peer = free_port()
    settings = fast_settings(local_port=free_port(), peer_port=peer)
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    sidecar = Sidecar(settings, {"MASTER_PORT": str(peer)}, resolver=FakeResolver(), spec=spec)
    with pytest.raises(
        ConfigError, match=rf"MASTER_PORT={peer} .*peer API \(RALLYPOINT_PEER_PORT\)"
    ):
        await sidecar.start()


async def test_a_preferred_port_on_the_sidecars_own_listener_is_passed_over() -> None:
    local, peer = free_port(), free_port()
    settings = fast_settings(local_port=local, peer_port=peer, master_port=peer, tf_port=local)
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    resolver = FakeResolver({"node0": ["127.0.0.1"]})
    async with Sidecar(settings, {}, resolver=resolver, spec=spec) as s:
        assert s.node.held["master"].port not in (local, peer)
        assert s.node.held["tf"].port not in (local, peer)
        assert await s.node.readiness.wait_ready(20)
        ports_ = s.node.status()["ports"]
        # The first skipped is ours; a later preferred port (29500) may be another test's.
        assert [skip["port"] for skip in ports_["master"]["skipped"]][:1] == [peer]  # type: ignore[index]
        assert [skip["port"] for skip in ports_["tf"]["skipped"]][:1] == [local]  # type: ignore[index]


async def test_shutdown_turns_readiness_off_first() -> None:
    async with cluster(1) as c:
        c.resolvers[0].set("node0", ["127.0.1.1"])
        sidecar = await c.start(0)
        await all_ready(c)
        sidecar.node.begin_shutdown()
        assert codes(sidecar) == {"shutting_down"}
        async with aiohttp.ClientSession() as http, http.get(c.local_url(0, "/readyz")) as resp:
            assert resp.status == 503


def ephemeral_free_port() -> int:
    """A port inside the kernel's ephemeral range that is free right now."""
    low, high = ports.ephemeral_range()
    return free_port(low=low, high=high)


async def test_a_user_master_port_inside_the_ephemeral_range_is_honoured() -> None:
    """The ephemeral-range exclusion is for ports rallypoint picks, not for the user's."""
    wanted = ephemeral_free_port()
    settings = fast_settings(local_port=free_port(), peer_port=free_port(), frameworks={"torch"})
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    resolver = FakeResolver({"node0": ["127.0.0.1"]})
    async with Sidecar(settings, {"MASTER_PORT": str(wanted)}, resolver=resolver, spec=spec) as s:
        assert s.node.held["master"].port == wanted
        assert await s.node.readiness.wait_ready(20)
        env = s.node.readiness.env
        assert env is not None and env.get("MASTER_PORT") == str(wanted)


def unused_low_port() -> int:
    """A free port below the ephemeral range and rallypoint's port range: a TF port of choice."""
    for port in range(2300, 2400):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 2300-2399")


async def _poke(c: Cluster, rank: int) -> None:
    body = json.dumps({"session": SESSION, "epoch": "test"}).encode()
    async with (
        aiohttp.ClientSession() as http,
        http.post(c.peer_url(rank, "/v1/poke"), data=body) as resp,
    ):
        assert resp.status == 204


async def test_a_generation_change_pokes_workers_out_of_their_backoff() -> None:
    """Worker 2 sleeps an hour after losing the master; only the master's poke wakes it."""
    slow = {"backoff_initial_s": 3600.0, "backoff_max_s": 3600.0}
    async with ready_cluster(3, per_node={2: slow}) as c:
        old = c.nodes[0].node.verification.generation
        # Worker 2 loses the master's name, is made to re-join, fails and sleeps.
        c.resolvers[2].remove("node0")
        await _poke(c, 2)
        node2 = c.nodes[2].node
        await until(lambda: node2.readiness.master_problem is not None)
        c.resolvers[2].set("node0", [address(0)])
        # Worker 1 comes back with other facts: the master issues a new generation.
        await c.stop(1)
        c.per_node[1] = {"tf_port": unused_low_port()}
        await c.start(1)
        master = c.nodes[0].node
        await until(
            lambda: master.verification.generation not in (None, old) and master.readiness.ready
        )
        await until(
            lambda: (
                node2.verification.generation == master.verification.generation
                and node2.readiness.ready
            )
        )
        assert node2.readiness.master_problem is None
        assert c.nodes[0].metrics.value("rallypoint_pokes_sent_total", result="accepted") >= 2


async def test_a_name_fixed_after_the_deadline_turns_the_cluster_ready() -> None:
    """The master's check of node2's name failed past its deadline; once the name resolves,
    node2's next join (or the master's own re-check) makes it ready, same generation."""
    async with cluster(3, per_node={0: {"deadline_s": 0.5}}) as c:
        c.resolvers[0].remove("node2")
        await start_all(c)
        master = c.nodes[0].node
        await until(lambda: {"resolve_failed", "deadline_exceeded"} <= codes(c.nodes[0]))
        assert not master.readiness.ready
        generation = master.verification.generation
        c.resolvers[0].set("node2", [address(2)])
        await _poke(c, 2)  # node2 re-joins with the same facts: no new generation
        await until(lambda: master.readiness.ready)
        assert master.verification.generation == generation
