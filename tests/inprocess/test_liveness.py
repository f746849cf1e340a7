"""After ready: a node that stops answering is named on every other node, and cleared on return.

In-process nodes on loopback: a sidecar stopped without a goodbye (Cluster.kill, as a crash)
leaves its peer port refusing connections, so the cause the master finds is "refused". One
stopped with its goodbye (Cluster.stop, as SIGTERM) is shown left, never down. Paused and
cut-off nodes are the multi-host tier's (tests/multihost/test_liveness.py).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from typing import Any

import aiohttp

from rallypoint.sidecar import Sidecar
from tests.support.api import checked
from tests.support.cluster.inprocess import Cluster, all_ready, cluster, ready_cluster, until

TOKEN = "liveness-test-secret"
PEER_UP = re.compile(r'^rallypoint_peer_up\{peer="([^"]+)"\} (\S+)$', re.M)
#: A keep-alive every 0.2 s: a silent peer is named after 0.8 s.
FAST = {"keepalive_s": 0.2}


def down(sidecar: Sidecar) -> dict[str, dict[str, Any]]:
    """host -> its entry in this node's /status liveness.down."""
    section = sidecar.node.status()["liveness"]
    assert isinstance(section, dict)
    return {d["host"]: d for d in section["down"]}


def left(sidecar: Sidecar) -> list[str]:
    """The hosts in this node's /status liveness.left."""
    section = sidecar.node.status()["liveness"]
    assert isinstance(section, dict)
    return [x["host"] for x in section["left"]]


def named_everywhere(c: Cluster, host: str, *, but: int) -> bool:
    return all(host in down(s) for r, s in c.nodes.items() if r != but)


def nobody_down(c: Cluster) -> bool:
    return all(not down(s) for s in c.nodes.values())


def per_node(n: int, **extra: object) -> dict[int, dict[str, object]]:
    return {r: {**FAST, **extra} for r in range(n)}


async def test_a_dead_worker_is_named_everywhere_and_cleared_when_back() -> None:
    async with ready_cluster(4, token=TOKEN, per_node=per_node(4)) as c:
        before = {r: s.node.readiness.env for r, s in c.nodes.items()}
        await c.kill(2)
        await until(lambda: named_everywhere(c, "node2", but=2))
        master = down(c.nodes[0])["node2"]
        assert master["cause"] == "refused", master
        assert master["seen_by"] == "node0"
        assert master["rank"] == 2 and master["for_s"] > 0.8
        relayed = down(c.nodes[1])["node2"]
        assert relayed["seen_by"] == "node0" and relayed["cause"] == "refused"
        # The env stays served and the nodes stay ready: the job owns what happens next.
        for rank in (0, 1, 3):
            readiness = c.nodes[rank].node.readiness
            assert readiness.ready and readiness.env == before[rank]
            assert any("node2 (rank 2) is down" in w for w in readiness.warnings())
            metrics = c.nodes[rank].metrics
            # The master has a series per node; a worker only for its upstream: the node
            # down is the master's series, and the worker's count.
            series = dict(PEER_UP.findall(metrics.render().decode()))
            expected = {"node1": "1.0", "node2": "0.0", "node3": "1.0"}
            assert series == (expected if rank == 0 else {"node0": "1.0"}), series
            assert metrics.value("rallypoint_peers_down") == 1
        await c.start(2)
        await all_ready(c)
        await until(lambda: nobody_down(c))
        assert c.nodes[0].metrics.value("rallypoint_peer_up", peer="node2") == 1
        assert not any("is down" in w for w in c.nodes[1].node.readiness.warnings())


async def sample_until(c: Cluster, done: Callable[[], bool]) -> int:
    """Read every node's /status every few ms until ``done``, asserting at each reading that
    its down list and its warnings name the same nodes; how many readings were taken."""
    readings = 0
    async with asyncio.timeout(30.0):
        while True:
            for rank, sidecar in c.nodes.items():
                status = sidecar.node.status()
                section = status["liveness"]
                assert isinstance(section, dict)
                listed = {d["host"] for d in section["down"]}
                warned = {w.split(" ")[0] for w in status["warnings"] if " is down: " in w}
                assert listed == warned, (rank, section["down"], status["warnings"])
                readings += 1
            if done():
                return readings
            await asyncio.sleep(0.003)


async def test_the_down_list_and_the_warnings_are_one_verdict() -> None:
    # /status's liveness.down and its warnings come from the same verdict: a node heard
    # again is not cleared in one while the other still names it (nor named in one first).
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await c.kill(2)
        assert await sample_until(c, lambda: named_everywhere(c, "node2", but=2)) > 0
        await c.start(2)
        await all_ready(c)
        assert await sample_until(c, lambda: nobody_down(c)) > 0


async def test_a_dead_master_is_named_by_every_worker_itself() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await c.kill(0)
        await until(lambda: named_everywhere(c, "node0", but=0))
        for rank in (1, 2):
            entry = down(c.nodes[rank])["node0"]
            assert entry["seen_by"] == f"node{rank}"
            assert entry["cause"] == "refused", entry
            assert entry["since"] < entry["since"] + entry["for_s"]
        await c.start(0)
        await all_ready(c)
        await until(lambda: nobody_down(c))


async def test_in_a_tree_a_dead_relay_and_a_dead_member_are_named() -> None:
    # Groups of 2 over 5 ranks: the master serves rank 1; rank 2 relays for rank 3; rank 4
    # relays for nobody.
    async with ready_cluster(5, token=TOKEN, per_node=per_node(5, relay_group_size=2)) as c:
        await c.kill(3)  # heard of by the master only through relay 2's keep-alives
        await until(lambda: named_everywhere(c, "node3", but=3))
        assert down(c.nodes[0])["node3"]["cause"] == "refused"
        await c.start(3)
        await all_ready(c)
        await until(lambda: nobody_down(c))
        await c.kill(2)  # the relay: its member goes around it and names it itself
        await until(lambda: named_everywhere(c, "node2", but=2))
        assert down(c.nodes[3])["node2"]["seen_by"] == "node3"
        assert "node0" not in down(c.nodes[3])
        await c.start(2)
        await all_ready(c)
        await until(lambda: nobody_down(c))


async def test_a_node_that_says_goodbye_is_left_everywhere_never_down_and_back_on_return() -> None:
    """In a tree (rank 3 in relay 2's group): a member's goodbye reaches the master through
    its relay, the relay's and a worker's reach their upstream, and every other node shows
    each as left, past the bound; a node started again is watched again."""
    async with ready_cluster(5, token=TOKEN, per_node=per_node(5, relay_group_size=2)) as c:
        for leaving in (3, 4):
            await c.stop(leaving)
            host = f"node{leaving}"
            await until(lambda h=host: all(h in left(s) for s in c.nodes.values()))  # type: ignore[misc]
        await asyncio.sleep(1.2)  # past the 0.8 s bound (1.0 s for an upstream)
        for sidecar in c.nodes.values():
            assert left(sidecar) == ["node3", "node4"] and not down(sidecar)
        for leaving in (3, 4):
            await c.start(leaving)
        await all_ready(c)
        await until(lambda: all(not left(s) for s in c.nodes.values()))
        await c.kill(3)  # back, watched again: a crash now is named down as ever
        await until(lambda: named_everywhere(c, "node3", but=3))
        assert "node3" not in left(c.nodes[0])


async def test_an_unsigned_goodbye_is_refused_and_changes_nothing() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        body = b'{"session": "sess-1", "rank": 2, "host": "node2", "leaving": true}'
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/alive"), data=body) as answer,
        ):
            assert answer.status == 401, await answer.text()
        await asyncio.sleep(0.5)  # past two keep-alives of node2's
        assert left(c.nodes[0]) == [] and not down(c.nodes[0])


async def test_a_goodbye_that_fails_still_stops_the_sidecar_and_the_node_is_named_down() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        keepalive = c.nodes[2].node.keepalive
        assert keepalive is not None

        async def broken(timeout_s: float) -> None:
            raise RuntimeError("planted")

        keepalive.goodbye = broken  # type: ignore[method-assign]
        await c.stop(2)  # returns: the sidecar stopped and let its ports go
        await until(lambda: named_everywhere(c, "node2", but=2))
        assert left(c.nodes[0]) == []


async def test_keepalive_off_has_no_watch() -> None:
    async with ready_cluster(2, per_node=per_node(2, keepalive_s=0.0)) as c:
        section = c.nodes[1].node.status()["liveness"]
        assert section == {"enabled": False, "watching": False, "left": [], "down": []}


async def test_bad_keepalives_are_refused_with_one_line() -> None:
    async with ready_cluster(2, per_node=per_node(2)) as c:
        async with aiohttp.ClientSession() as http:
            for body, code in [
                (b"[]", "bad_request"),
                (b'{"session": "sess-1", "rank": 7, "host": "node7"}', "spec_mismatch"),
                (b'{"session": "other", "rank": 1, "host": "node1"}', "session_mismatch"),
                (b'{"session": "sess-1", "rank": 1, "host": "node1", "heard": [[1]]}',
                 "bad_request"),
            ]:  # fmt: skip
                async with http.post(c.peer_url(0, "/v1/alive"), data=body) as resp:
                    answer = json.loads(await checked(resp, "POST", "/v1/alive"))
                    assert resp.status in (400, 409), (body, resp.status, answer)
                    assert answer["code"] == code, answer
                    assert "\n" not in answer["error"]
        assert c.nodes[0].node.readiness.ready


async def test_a_keepalive_is_answered_as_documented_with_who_is_down() -> None:
    async with ready_cluster(3, per_node=per_node(3)) as c:
        await c.kill(2)
        await until(lambda: "node2" in down(c.nodes[0]))
        body = b'{"session": "sess-1", "rank": 1, "host": "node1", "heard": [[2, 0.5]]}'
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/alive"), data=body) as resp,
        ):
            assert resp.status == 200
            answer = json.loads(await checked(resp, "POST", "/v1/alive"))
        assert answer["total"] == 1 and [d["host"] for d in answer["down"]] == ["node2"]


async def test_a_node_shut_down_before_ready_stops_its_keepalive() -> None:
    async with cluster(2, per_node=per_node(2)) as c:
        await c.start(1)  # the master never comes: rank 1 is never ready
        node = c.nodes[1].node
        node.begin_shutdown()
        keepalive = node.keepalive
        assert keepalive is not None
        await asyncio.wait_for(keepalive.run(), 5.0)  # returns, does not spin
