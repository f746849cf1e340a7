"""The supervised job, cluster-wide: reports travel on the keep-alives, the first failure reaches
every node, and nothing healthy is ever stopped.

In-process nodes on loopback, each job reported through the same JobWatch.report that the
local API's POST /job calls. The real `rallypoint run` processes, with real jobs and faults,
are the multi-host tier's (tests/multihost/test_run.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest

from rallypoint.core.jobs import JobState
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.rendezvous.afterready.jobwatch import JobWatch
from rallypoint.rendezvous.afterready.keepalive import Keepalive
from rallypoint.sidecar import Sidecar
from rallypoint.wire import alive
from rallypoint.wire.jobstates import Report
from tests.support.cluster.inprocess import Cluster, all_ready, ready_cluster, until

TOKEN = "jobs-test-secret"
#: A keep-alive every 0.2 s: a silent peer is named after 0.8 s.
FAST = {"keepalive_s": 0.2}
#: A keep-alive every 5 s: any stop sooner than that was pushed, not polled.
SLOW = {"keepalive_s": 5.0}


def per_node(n: int, **extra: object) -> dict[int, dict[str, object]]:
    return {r: {**FAST, **extra} for r in range(n)}


def job(sidecar: Sidecar) -> dict[str, Any]:
    section = sidecar.node.status()["job"]
    assert isinstance(section, dict)
    return section


def liveness(sidecar: Sidecar) -> dict[str, Any]:
    section = sidecar.node.status()["liveness"]
    assert isinstance(section, dict)
    return section


async def report(sidecar: Sidecar, state: str, **fields: Any) -> None:
    jobs = sidecar.node.jobs
    assert jobs is not None
    await jobs.report(Report(state, fields.pop("started", 1000.0), **fields), settle_s=1.0)


async def all_running(c: Cluster) -> None:
    for sidecar in c.nodes.values():
        await report(sidecar, "running")
    await until(lambda: all(job(s)["counts"]["running"] == c.n for s in c.nodes.values()))


def first(sidecar: Sidecar) -> dict[str, Any] | None:
    return job(sidecar)["first"]


async def test_a_failed_job_reaches_every_node_with_its_status_at_once() -> None:
    async with ready_cluster(4, token=TOKEN, per_node={r: SLOW for r in range(4)}) as c:
        await all_running(c)
        started = time.monotonic()
        await report(c.nodes[2], "exited", code=3)
        await until(lambda: all(first(s) is not None for s in c.nodes.values()), timeout_s=20)
        # Far below one 5 s interval: the worker sent it at once, the master pushed it.
        assert time.monotonic() - started < 2.5
        for rank, sidecar in c.nodes.items():
            seen = first(sidecar)
            assert seen is not None
            assert (seen["host"], seen["rank"], seen["state"], seen["code"]) == (
                "node2",
                2,
                "exited",
                3,
            )
            assert job(sidecar)["stop"] is (rank != 2)
        assert c.nodes[0].metrics.value("rallypoint_job_failures_total", cause="exited") == 1
        assert c.nodes[0].metrics.value("rallypoint_jobs", state="exited") == 1


async def test_the_master_s_own_failure_is_pushed_to_every_worker() -> None:
    async with ready_cluster(3, token=TOKEN, per_node={r: SLOW for r in range(3)}) as c:
        await all_running(c)
        await report(c.nodes[0], "killed", signal=9)
        await until(lambda: all(job(s)["stop"] for r, s in c.nodes.items() if r), timeout_s=2.5)
        seen = first(c.nodes[1])
        assert seen is not None and seen["what"] == "killed by SIGKILL"
        assert job(c.nodes[0])["stop"] is False


async def test_the_first_failure_is_the_earliest_one_everywhere() -> None:
    async with ready_cluster(4, token=TOKEN, per_node=per_node(4)) as c:
        await all_running(c)
        # Both fail; node3's happened first by the master's clock, whoever is heard first.
        await asyncio.gather(
            report(c.nodes[1], "exited", code=1), report(c.nodes[3], "killed", signal=6)
        )
        await until(
            lambda: all(
                s.node.jobs is not None and len(s.node.jobs.book.failures()) == 2
                for s in c.nodes.values()
            )
        )
        names = {r: (first(s) or {}).get("host") for r, s in c.nodes.items()}
        assert len(set(names.values())) == 1, names


async def test_a_lost_node_whose_job_ran_stops_the_others() -> None:
    """Its sidecar stops (SIGTERM) while its job runs: a node that may be going down says no
    goodbye, and silence names it lost."""
    async with ready_cluster(4, token=TOKEN, per_node=per_node(4)) as c:
        await all_running(c)
        await c.stop(2)
        await until(lambda: all(job(s)["stop"] for s in c.nodes.values()))
        for sidecar in c.nodes.values():
            seen = first(sidecar)
            assert seen is not None and seen["state"] == "lost" and seen["host"] == "node2"
            assert "nothing heard" in seen["detail"] and "refused" in seen["detail"]
            assert liveness(sidecar)["left"] == []
        assert c.nodes[1].metrics.value("rallypoint_job_failures_total", cause="lost") == 1


async def test_a_lost_master_is_named_by_every_worker() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await all_running(c)
        await c.stop(0)
        await until(lambda: all(job(s)["stop"] for s in c.nodes.values()))
        for sidecar in c.nodes.values():
            seen = first(sidecar)
            assert seen is not None and (seen["host"], seen["state"]) == ("node0", "lost")


async def test_a_node_cut_off_is_named_lost_first_and_its_own_failure_waits_for_its_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # node2's keep-alives and the master's to node2 fail both ways (its peer port cut); the
    # job's own traffic is not the sidecars' business. The master names node2 after 4
    # intervals, node2 the master after 5: the cluster decides first.
    # A 2 s interval: the master's verdict leads by 2 s, more than this event loop, shared by
    # three nodes, stalls on a loaded machine (1 s was once not enough beside the suite).
    interval = 2.0
    settings = {r: {"keepalive_s": interval} for r in range(3)}
    async with ready_cluster(3, token=TOKEN, per_node=settings) as c:
        await all_running(c)
        master, cut = c.nodes[0].node.keepalive, c.nodes[2].node.keepalive
        assert master is not None and cut is not None

        def unreachable(keepalive: Keepalive, *, only: int | None = None) -> None:
            send = keepalive._send

            async def dropped(rank: int, body: bytes, timeout_s: float, **kw: Any) -> bool:
                if only is not None and rank != only:
                    return await send(rank, body, timeout_s, **kw)
                await asyncio.sleep(timeout_s)
                keepalive.watch.failed(rank, "timed_out", "cut off")
                return False

            monkeypatch.setattr(keepalive, "_send", dropped)

        unreachable(master, only=2)
        unreachable(cut)
        await until(lambda: job(c.nodes[0])["stop"] and job(c.nodes[1])["stop"])
        for rank in (0, 1):
            seen = first(c.nodes[rank])
            assert seen is not None and (seen["host"], seen["state"]) == ("node2", "lost")
        # node2 has not named the master yet: it is still waiting for news.
        view = job(c.nodes[2])
        assert view["first"] is None and view["stop"] is False, view
        assert 0 < view["unsettled_s"] <= 5 * interval, view
        # Its job fails on the others' closed connections: its own failure, for now.
        jobs = c.nodes[2].node.jobs
        assert jobs is not None
        await jobs.report(Report("exited", 1000.0, code=1), settle_s=0.0)
        view = job(c.nodes[2])
        assert view["first"]["host"] == "node2" and view["stop"] is False, view
        assert view["unsettled_s"] > 0, view
        # Within the unsettled time the master is named lost, and it is the earlier failure.
        await until(lambda: job(c.nodes[2])["stop"], timeout_s=view["unsettled_s"] + 2.0)
        seen = first(c.nodes[2])
        assert seen is not None and (seen["host"], seen["state"]) == ("node0", "lost")
        assert job(c.nodes[2])["unsettled_s"] == 0


@pytest.mark.parametrize("leaving", [0, 2])
async def test_a_node_done_then_gone_with_a_goodbye_is_left_never_down(leaving: int) -> None:
    """Its job ended 0, then its sidecar stops (SIGTERM): every other node shows it left,
    never down however long it stays away, and has no peer_up series for it."""
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await all_running(c)
        await report(c.nodes[leaving], "exited", code=0)
        await c.stop(leaving)
        others = list(c.nodes.values())
        await until(
            lambda: all(leaving in [x["rank"] for x in liveness(s)["left"]] for s in others)
        )
        await asyncio.sleep(1.5)  # past the liveness bound (0.8 s) twice over
        for sidecar in others:
            assert [x["host"] for x in liveness(sidecar)["left"]] == [f"node{leaving}"]
            assert liveness(sidecar)["down"] == [], liveness(sidecar)
            text = sidecar.node.metrics.render().decode()
            assert f'rallypoint_peer_up{{peer="node{leaving}"}}' not in text
            assert "rallypoint_peers_left 1.0" in text
            assert first(sidecar) is None and job(sidecar)["stop"] is False
            assert job(sidecar)["counts"]["exited"] == 1


async def test_a_node_done_then_gone_without_a_goodbye_is_down_and_stops_nothing() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await all_running(c)
        await report(c.nodes[2], "exited", code=0)
        await c.kill(2)
        others = list(c.nodes.values())
        # Past the liveness bound (0.8 s): named down, never lost.
        await until(lambda: all(2 in [d["rank"] for d in liveness(s)["down"]] for s in others))
        await asyncio.sleep(1.0)
        for sidecar in others:
            assert first(sidecar) is None and job(sidecar)["stop"] is False
            assert job(sidecar)["counts"]["exited"] == 1


async def test_a_sidecar_restarted_while_the_jobs_run_stops_nothing() -> None:
    async with ready_cluster(3, token=TOKEN, per_node=per_node(3)) as c:
        await all_running(c)
        for rank in (1, 0):
            await c.stop(rank)
            await c.start(rank)
            # `run` reconnects and reports again; the new sidecar keeps alive at once.
            await report(c.nodes[rank], "running")
            await asyncio.sleep(0.3)  # within the 0.8 s bound of the first silence
        await all_ready(c)
        await asyncio.sleep(1.5)  # and past it: nobody may be named lost now
        for sidecar in c.nodes.values():
            assert first(sidecar) is None and job(sidecar)["stop"] is False


async def test_in_a_relay_tree_a_failure_reaches_every_group() -> None:
    n = 7
    settings = {r: {**SLOW, "relay_group_size": 3} for r in range(n)}
    async with ready_cluster(n, token=TOKEN, per_node=settings) as c:
        await all_running(c)
        await report(c.nodes[5], "exited", code=4)  # in relay 3's group
        await until(lambda: all(job(s)["stop"] for r, s in c.nodes.items() if r != 5), 2.5)
        assert all((first(s) or {}).get("code") == 4 for s in c.nodes.values())


async def test_an_unsigned_or_malformed_job_message_is_refused_and_stops_nothing() -> None:
    async with ready_cluster(2, token=TOKEN, per_node=per_node(2)) as c:
        await all_running(c)
        lie = {
            "session": "sess-1",
            "rank": 1,
            "host": "node1",
            "job": {"rank": 1, "host": "node1", "state": "exited", "code": 1},
        }
        async with aiohttp.ClientSession() as http:
            async with http.post(c.peer_url(0, "/v1/alive"), json=lie) as resp:
                assert resp.status == 401
            bad = dict(lie, job={"rank": 1, "host": "node1", "state": "exploded"})
            async with http.post(c.peer_url(0, "/v1/alive"), json=bad) as resp:
                assert resp.status in (400, 401)
        await asyncio.sleep(0.5)
        assert first(c.nodes[0]) is None and first(c.nodes[1]) is None


async def test_the_end_of_a_run_counts_whatever_the_clock_offset_did_meanwhile() -> None:
    # A worker's offset to the master changes with every clock sample; the run's name (its
    # start) must not, or its end would look like an older run's and be dropped.
    offset = [0.0]
    spec = ClusterSpec("explicit", ("node0", "node1"), 1, 2, "sess")
    watch = JobWatch(
        spec, Metrics(), boot="b", group_size=0, now=time.time, offset=lambda: offset[0]
    )
    await watch.report(Report("running", 1000.0004), settle_s=0)
    offset[0] = 0.002
    await watch.report(Report("exited", 1000.0004, 0), settle_s=0)
    assert watch.book.state(1).state == "exited"


async def test_a_node_stamps_its_own_states_as_the_wire_carries_them() -> None:
    # Two failures within one millisecond: the wire rounds stamps to 1 ms, and a node whose
    # own copy kept more digits ordered them otherwise than every other node.
    spec = ClusterSpec("explicit", ("node0", "node1", "node2"), 1, 3, "sess")
    clock = [1000.1231]
    watch = JobWatch(spec, Metrics(), boot="b", group_size=0, now=lambda: clock[0])
    await watch.report(Report("running", 999.0), settle_s=0)
    await watch.report(Report("exited", 999.0, 1), settle_s=0)
    assert watch.book.state(1).since == 1000.123
    # node2's failure 0.3 ms later, as the wire brings it: the tie goes to the lower rank.
    later = JobState(2, "node2", "killed", 999.0, round(1000.1234, 3), signal=6)
    await watch.from_peer(alive.Alive("sess", 2, "node2", job=later), upstream=False)
    first = watch.book.first
    assert first is not None and first.rank == 1


async def test_the_master_starts_no_attempt_until_the_cluster_is_verified() -> None:
    """Every node is starting while the cluster checks a new generation (a node came back
    with a new address; the master is not ready): the attempt starts only once every node
    passed, and then at once, without waiting for the next report."""
    spec = ClusterSpec("explicit", ("node0", "node1"), 0, 2, "sess")
    ready, flipped = [False], asyncio.Event()

    async def changed() -> None:
        await flipped.wait()
        flipped.clear()

    watch = JobWatch(spec, Metrics(), boot="b", group_size=0, now=time.time, ready=lambda: ready[0])
    following = asyncio.create_task(watch.follow(changed))
    try:
        await watch.report(Report("starting", 999.0), settle_s=0)
        peer = JobState(1, "node1", "starting", 998.0, round(time.time(), 3), attempt=0)
        await watch.from_peer(alive.Alive("sess", 1, "node1", job=peer), upstream=False)
        assert watch.book.state(0).state == "starting"
        await asyncio.sleep(0.2)
        assert watch.book.go == -1 and watch.view().start is None
        ready[0] = True
        flipped.set()
        await until(lambda: watch.view().start == 0, timeout_s=5.0)
    finally:
        following.cancel()
