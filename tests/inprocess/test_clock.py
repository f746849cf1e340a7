"""Clock offsets in a real (in-process) cluster: a skewed node joins and is named for it.

Every sidecar runs in one process, so "a clock 600 s ahead" is a wall clock seam
(Cluster.clocks) that the node's Authenticator and its offset estimate read.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import aiohttp
import msgspec
import pytest
from aiohttp import web

from rallypoint.auth import NONCE_HEADER, Authenticator
from rallypoint.sidecar import Sidecar
from tests.support.cluster.inprocess import (
    SESSION,
    cluster,
    codes,
    ready_cluster,
    until,
)


def ahead(seconds: float) -> Callable[[], float]:
    return lambda: time.time() + seconds


def clock_warnings(sidecar: Sidecar) -> list[str]:
    return [w for w in sidecar.node.readiness.warnings() if "clock is" in w]


def cluster_clock(master: Sidecar) -> dict[str, object]:
    nodes = master.node.status()["cluster"]
    assert isinstance(nodes, list)
    return {n["host"]: n["clock_offset_s"] for n in nodes}


@pytest.mark.parametrize("token", ["s3cret", None], ids=["token", "no-token"])
async def test_a_worker_ten_minutes_ahead_joins_and_is_named(token: str | None) -> None:
    async with ready_cluster(3, token=token, clocks={2: ahead(600)}) as c:
        master, skewed = c.nodes[0], c.nodes[2]
        verdict = master.node.book.verdict.current  # type: ignore[union-attr]
        assert verdict is not None and verdict.verified
        named = [w for w in verdict.warnings if w.startswith("node2's clock is 600.")]
        assert len(named) == 1, verdict.warnings
        assert "s ahead of the master's (measured over a" in named[0]
        assert "run NTP on every node" in named[0]
        # Every node shows it (the verdict's warnings), and only node2 is named.
        for sidecar in c.nodes.values():
            assert clock_warnings(sidecar) == named
        offsets = cluster_clock(master)
        assert offsets["node2"] == pytest.approx(600, abs=1)
        assert offsets["node1"] == pytest.approx(0, abs=1)
        own = skewed.node.status()["clock"]
        assert isinstance(own, dict)
        assert own["offset_s"] == pytest.approx(600, abs=1) and own["source"] == "master"
        assert own["samples"] >= 1 and 0 <= own["rtt_s"] < 1
        assert skewed.metrics.value("rallypoint_clock_offset_seconds") == pytest.approx(600, abs=1)
        assert master.node.status()["clock"]["reference"] is True  # type: ignore[index]
        assert master.metrics.value("rallypoint_clock_offset_seconds") == 0


async def test_a_worker_behind_is_named_as_behind() -> None:
    async with ready_cluster(2, token="s3cret", clocks={1: ahead(-600)}) as c:
        [warning] = clock_warnings(c.nodes[0])
        assert warning.startswith("node1's clock is 600.") and "s behind the master's" in warning


async def test_offsets_below_a_second_give_no_warning() -> None:
    async with ready_cluster(3, token="s3cret", clocks={1: ahead(0.4), 2: ahead(-0.4)}) as c:
        assert [w for w in c.nodes[0].node.readiness.warnings() if "clock" in w] == []
        offsets = cluster_clock(c.nodes[0])
        assert offsets["node1"] == pytest.approx(0.4, abs=0.2)
        assert offsets["node2"] == pytest.approx(-0.4, abs=0.2)


async def test_a_member_behind_a_relay_is_measured_against_the_master() -> None:
    """The relay (rank 3, itself 5 s behind) answers rank 4's joins on its corrected clock."""
    tree = {rank: {"relay_group_size": 3} for rank in range(7)}
    clocks = {3: ahead(-5), 4: ahead(600)}
    async with ready_cluster(7, token="s3cret", per_node=tree, clocks=clocks) as c:
        assert c.nodes[4].node.master_target == ("127.0.0.1", c.peer_ports["node3"])
        offsets = cluster_clock(c.nodes[0])
        assert offsets["node3"] == pytest.approx(-5, abs=1)
        assert offsets["node4"] == pytest.approx(600, abs=1)  # not 605: the master's clock
        warnings = clock_warnings(c.nodes[0])
        assert any(
            w.startswith("node4's clock is 600.") and "through its relay" in w for w in warnings
        )
        assert any(w.startswith("node3's clock is 5.0 s behind") for w in warnings)


async def test_the_masters_warnings_follow_its_verdict_after_ready() -> None:
    """A report that reaches the master after its verdict (a relay's member whose clock was
    measured anew) moves the master's warning: it reads its book, not the verdict it
    turned ready with."""
    async with ready_cluster(2, token="s3cret", clocks={1: ahead(600)}) as c:
        master = c.nodes[0].node
        assert master.book is not None
        [before] = clock_warnings(c.nodes[0])
        assert before.startswith("node1's clock is 600.")
        report = master.book.verdict.reports[1]
        assert report.clock is not None
        later = msgspec.structs.replace(report.clock, offset_s=300.0)
        master.book.verdict.report(msgspec.structs.replace(report, clock=later))
        [after] = clock_warnings(c.nodes[0])
        assert after.startswith("node1's clock is 300.0 s ahead"), after
        assert before not in master.readiness.warnings()


def _join_body(rank: int, host: str) -> bytes:
    member = {"rank": rank, "host": host, "addresses": ["198.51.100.11"], "tf_port": None}
    return json.dumps({"session": SESSION, **member}).encode()


def behind_600(skew_s: object) -> bool:
    """A skew measured against a clock 600 s behind: its whole-second timestamp, floor(t - 600),
    against the receiver's t + the request's time in flight, so in (-601 - flight, -600]."""
    return isinstance(skew_s, float | int) and -602 < skew_s <= -600


async def test_the_master_names_a_node_whose_join_it_refused_as_stale() -> None:
    async with cluster(2, token="s3cret") as c:
        master = await c.start(0)
        body = _join_body(1, "node1")
        old = Authenticator("s3cret", clock=ahead(-600))
        headers = old.sign("POST /v1/join", body)
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/join"), data=body, headers=headers) as resp,
        ):
            assert resp.status == 401
            answer = await resp.read()
            data = json.loads(answer)
            # The refusal proves itself: signed, and echoing our nonce, whatever its age.
            old.verify_echo(
                "401 /v1/join",
                answer,
                resp.headers,
                sent=headers[NONCE_HEADER],
                echoed=data["clock"]["nonce"],
            )
        assert data["reason"] == "stale" and behind_600(data["skew_s"])
        assert data["clock"]["source"] == "master"
        [reason] = [r for r in master.node.readiness.reasons() if r.code == "clock_skew"]
        assert reason.host == "node1" and reason.ranks == (1,)
        # Timestamps are whole seconds: 600 s behind reads as 600 or 601.
        assert re.match(r"node1 has not joined: its messages are 60[01] s behind", reason.message)
        assert "waiting_for_join" in codes(master)
        refused = master.node.status()["clock"]["refused"]  # type: ignore[index]
        assert behind_600(refused["node1"])


@asynccontextmanager
async def fake_master(port: int, handler: web.Handler) -> AsyncIterator[None]:
    """Something on the master's peer port that answers every join with ``handler``."""
    app = web.Application()
    app.router.add_post("/v1/join", handler)
    app.router.add_get("/v1/cluster", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()


def refusal(*, signer: str | None, echo: bool) -> web.Handler:
    """A master that refuses joins as 600 s ahead: unsigned without a clock (an older
    version), or with a clock that is forged (another token) or answers another request."""

    async def handler(request: web.Request) -> web.Response:
        out: dict[str, object] = {"error": "stale", "code": "auth_failed", "skew_s": 600.0}
        if signer is not None:
            now = time.time()
            nonce = request.headers[NONCE_HEADER] if echo else "0" * 32
            out["clock"] = {"received": now, "answered": now, "source": "master", "nonce": nonce}
        body = json.dumps(out).encode()
        headers = {} if signer is None else Authenticator(signer).sign("401 /v1/join", body)
        return web.Response(status=401, body=body, headers=headers)

    return handler


@pytest.mark.parametrize(
    ("signer", "echo"),
    [(None, False), ("other-token", True), ("s3cret", False)],
    ids=["no-clock", "forged", "other-request"],
)
async def test_a_refusal_that_cannot_be_trusted_leaves_the_worker_clock_skew(
    signer: str | None, echo: bool
) -> None:
    handler = refusal(signer=signer, echo=echo)
    async with (
        cluster(2, token="s3cret", clocks={1: ahead(600)}) as c,
        fake_master(c.peer_ports["node0"], handler),
    ):
        worker = await c.start(1)
        await until(lambda: "clock_skew" in codes(worker))
        [reason] = [r for r in worker.node.readiness.reasons() if r.code == "clock_skew"]
        assert reason.host == "node0" and reason.detail == "+600.0"
        assert "the master node0 refused this node's messages as 600 s ahead of" in (reason.message)
        assert worker.node.offsets.count == 0  # nothing untrusted was adopted
        assert "auth_failed" not in codes(worker) and "waiting_for_cluster" not in codes(worker)


@pytest.mark.parametrize(
    ("clock", "field"),
    [
        ({"received": "soon", "answered": 1.0, "source": "master"}, "clock.received"),
        ({"received": 1e9, "answered": 1e9 - 5, "source": "master"}, "clock.answered"),
        ({"received": 1e9, "answered": 1e9, "source": "moon"}, "clock.source"),
        ("noon", "got `str` - at `$.clock`"),
    ],
)
async def test_a_join_answer_with_a_bad_clock_is_a_clear_error(clock: object, field: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        answer = {"session": SESSION, "epoch": "e", "generation": None, "joined": 1, "nnodes": 2}
        return web.json_response({**answer, "clock": clock})

    async with cluster(2) as c, fake_master(c.peer_ports["node0"], handler):
        worker = await c.start(1)
        await until(lambda: "master_answer_invalid" in codes(worker))
        [reason] = [r for r in worker.node.readiness.reasons() if r.code == "master_answer_invalid"]
        assert reason.message.startswith("the master's join answer: join answer: ")
        assert field in reason.message
        assert worker.node.offsets.count == 0


async def test_an_absurd_clock_claim_in_a_report_is_refused_by_the_master() -> None:
    async with ready_cluster(2) as c:
        doc = c.nodes[0].node.verification.doc
        assert doc is not None
        report = {
            "session": SESSION,
            "generation": doc.generation,
            "rank": 1,
            "host": "node1",
            "passed": True,
            "clock": {"offset_s": 1e300, "rtt_s": 0.001, "samples": 1, "source": "master"},
        }
        async with (
            aiohttp.ClientSession() as http,
            http.post(c.peer_url(0, "/v1/report"), data=json.dumps(report).encode()) as resp,
        ):
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error.startswith("report: ") and "`$.clock.offset_s`" in error
        assert c.nodes[0].node.readiness.ready  # the master carries on


async def test_a_clock_that_steps_after_ready_is_measured_again() -> None:
    step = [0.0]
    async with ready_cluster(2, token="s3cret", clocks={1: lambda: time.time() + step[0]}) as c:
        worker = c.nodes[1]
        assert worker.node.offsets.offset_s == pytest.approx(0, abs=0.5)
        step[0] = 600.0  # beyond the signatures' 30 s: its next long-poll is refused
        await until(lambda: abs(worker.node.offsets.offset_s - 600) < 1)
        assert worker.node.readiness.ready and "clock_skew" not in codes(worker)
        # The master still answers it: the long-poll after the correction is accepted.
        polls = worker.metrics.value("rallypoint_auth_failures_total", reason="refused")
        await until(
            lambda: (
                c.nodes[0].metrics.value(
                    "rallypoint_http_requests_total", api="peer", route="/v1/cluster", status="204"
                )
                >= 2
            )
        )
        assert worker.metrics.value("rallypoint_auth_failures_total", reason="refused") == polls
