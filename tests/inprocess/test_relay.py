"""The fan-out tree in a real (in-process) cluster: relays batch their group, fall back safely.

Seven nodes with groups of three: the master serves ranks 1-2 itself, rank 3 relays for
ranks 4-5, and rank 6 (first of a group with no other member) joins the master directly.
"""

from __future__ import annotations

import json

import aiohttp

from rallypoint.sidecar import Sidecar
from tests.support.cluster.inprocess import (
    Cluster,
    all_ready,
    cluster,
    codes,
    ready_cluster,
    restart,
    start_all,
    tried_the_master,
    until,
)
from tests.support.ports import black_hole

N = 7
GROUP = 3
TREE = {rank: {"relay_group_size": GROUP} for rank in range(N)}


def requests(sidecar: Sidecar, route: str, status: str = "200") -> float:
    return sidecar.metrics.value(
        "rallypoint_http_requests_total", api="peer", route=route, status=status
    )


def batches(sidecar: Sidecar, route: str, result: str) -> float:
    return sidecar.metrics.value("rallypoint_relay_batches_total", route=route, result=result)


def same_envs(c: Cluster) -> None:
    served = {r: s.node.readiness.env for r, s in c.nodes.items()}
    envs = {r: env.as_dict() for r, env in served.items() if env is not None}
    assert sorted(envs) == list(range(N))
    clusters = {json.dumps(json.loads(e["TF_CONFIG"])["cluster"]) for e in envs.values()}
    assert len(clusters) == 1
    assert {e["MASTER_PORT"] for e in envs.values()} == {str(c.nodes[0].node.held["master"].port)}
    assert len({s.node.verification.generation for s in c.nodes.values()}) == 1


async def test_a_relay_batches_its_group_for_the_master() -> None:
    async with ready_cluster(N, token="s3cret", per_node=TREE) as c:
        same_envs(c)
        master, relay = c.nodes[0], c.nodes[3]
        # Ranks 4 and 5 joined and reported through rank 3, never the master itself.
        assert requests(master, "/v1/joins") >= 1
        assert requests(master, "/v1/reports") >= 1
        assert requests(relay, "/v1/join") >= 2
        assert requests(relay, "/v1/report") >= 2
        assert requests(master, "/v1/join") >= 4  # ranks 1, 2, 3 and 6 (a poke may add one)
        for rank in (4, 5):
            assert c.nodes[rank].node.master_target == ("127.0.0.1", c.peer_ports["node3"])
        # The master's /status says which joins a relay batched, and whose they were.
        peers = {p["rank"]: p for p in master.node.status()["peers"]}  # type: ignore[union-attr]
        assert [peers[r]["relay"] for r in range(N)] == [None, None, None, None, 3, 3, None]
        for route in ("/v1/joins", "/v1/reports"):
            assert batches(relay, route, "accepted") >= 1
            assert batches(relay, route, "unreachable") == 0
        assert batches(c.nodes[4], "/v1/joins", "accepted") == 0  # counted by relays only
        status = relay.node.status()["relay"]
        assert isinstance(status, dict)
        assert status["ranks"] == [4, 5] and status["joined"] == 2
        assert "relay" not in c.nodes[4].node.status()


async def test_members_join_the_master_directly_while_their_relay_is_down() -> None:
    async with cluster(N, per_node=TREE) as c:
        for rank in (0, 1, 2, 4, 5, 6):
            await c.start(rank)
        await until(lambda: all(c.nodes[0].node.peers[r].joined for r in (4, 5)))
        await c.start(3)
        await all_ready(c)
        same_envs(c)
        assert requests(c.nodes[0], "/v1/join") == 6


async def test_a_failure_in_the_group_reaches_every_node_through_the_relay() -> None:
    async with cluster(N, per_node=TREE) as c:
        c.resolvers[5].remove("node1")
        await start_all(c)
        await until(lambda: all("resolve_failed" in codes(s) for s in c.nodes.values()))
        for rank, sidecar in c.nodes.items():
            assert not sidecar.node.readiness.ready
            reason = next(r for r in sidecar.node.readiness.reasons() if r.code == "resolve_failed")
            assert reason.host == "node1"
            if rank != 5:
                assert reason.message.startswith("node5 reports: "), reason.message
        c.resolvers[5].set("node1", ["198.51.100.11"])
        for sidecar in c.nodes.values():
            sidecar.node.verification.retry()  # type: ignore[union-attr]
        await all_ready(c)


async def test_a_master_restart_reaches_the_group_through_its_relay() -> None:
    async with ready_cluster(N, per_node=TREE) as c:
        await restart(c, 0)
        same_envs(c)
        # The new master heard of ranks 4 and 5 from the relay's batch.
        assert requests(c.nodes[0], "/v1/joins") >= 1


async def test_members_of_a_filtered_relay_do_not_wait_out_their_timeout() -> None:
    """Connects to rank 3's peer API hang (dropped, as by a firewall). Its members give up on
    it after RELAY_CONNECT_S, not after their --resolve-timeout, which here outlasts the
    deadline: waiting that out, they would never be ready."""
    slow = {"resolve_timeout_s": 60.0, "deadline_s": 20.0}
    per_node = {rank: {**TREE[rank], **(slow if rank in (4, 5) else {})} for rank in range(N)}
    with black_hole() as hole:
        async with cluster(N, per_node=per_node) as c:
            original = c.endpoint

            def endpoint(host: str, address: str) -> tuple[str, int]:
                return hole if host == "node3" else original(host, address)

            c.endpoint = endpoint  # type: ignore[method-assign]
            await start_all(c)
            await all_ready(c)
            same_envs(c)
            for rank in (4, 5):
                assert c.nodes[rank].node.master_target == ("127.0.0.1", c.peer_ports["node0"])


async def test_a_relay_counts_the_batches_the_master_did_not_take() -> None:
    async with ready_cluster(N, per_node=TREE) as c:
        await c.stop(0)
        await c.stop(4)
        await c.start(4)  # joins its relay, whose batch cannot reach the master
        await until(lambda: batches(c.nodes[3], "/v1/joins", "unreachable") >= 1)
        await c.start(0)
        await all_ready(c)
        same_envs(c)


async def test_a_restarted_relay_serves_its_group_again() -> None:
    async with ready_cluster(N, per_node=TREE) as c:
        await restart(c, 3)
        same_envs(c)


async def test_a_node_that_is_no_relay_sends_the_member_to_the_master() -> None:
    """Rank 4 thinks rank 3 relays for it; rank 3 was told otherwise (no tree)."""
    per_node = dict(TREE)
    per_node[3] = {"relay_group_size": 0}
    async with ready_cluster(N, per_node=per_node) as c:
        same_envs(c)
        assert requests(c.nodes[3], "/v1/join", "409") >= 1
        assert c.nodes[4].node.master_target == ("127.0.0.1", c.peer_ports["node0"])


async def test_a_relay_refuses_what_is_not_its_groups() -> None:
    async with ready_cluster(N, per_node=TREE) as c:
        body = {"session": "sess-1", "rank": 1, "host": "node1", "addresses": []}
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(3, "/v1/join"), json=body) as resp,
        ):
            assert resp.status == 409
            assert (await resp.json())["code"] == "not_relay"
        batch = {"session": "sess-1", "relay": 3, "members": []}
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(3, "/v1/joins"), json=batch) as resp,
        ):
            assert resp.status == 409
            assert (await resp.json())["code"] == "not_master"


async def test_a_master_that_starts_last_gets_the_groups_through_their_relay() -> None:
    """Members turned away while nobody reached the master wait in a backoff only a poke
    ends; the relay pokes them once the master answers, and they come back to the tree."""
    slow = {"relay_group_size": GROUP, "backoff_initial_s": 3600.0, "backoff_max_s": 3600.0}
    per_node = {**TREE, 4: slow, 5: slow}
    async with cluster(N, per_node=per_node) as c:
        for rank in range(1, N):
            await c.start(rank)
        await tried_the_master(c, (4, 5), timeout_s=30)
        await c.start(0)
        await all_ready(c, timeout_s=60)
        same_envs(c)
        assert batches(c.nodes[3], "/v1/joins", "accepted") >= 1
        for rank in (4, 5):
            assert c.nodes[rank].metrics.value("rallypoint_pokes_received_total") >= 1
            # Back in the tree: the last join went through the relay.
            assert c.nodes[rank].node.master_target == ("127.0.0.1", c.peer_ports["node3"])
