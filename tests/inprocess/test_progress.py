"""Each node's job progress, cluster-wide: `run`'s marks (POST /job/progress) ride the
keep-alives to the master, which shows every node's; every node shows the master's summary
and which node is behind (rendezvous/afterready/progresswatch.py).

In-process nodes on loopback; the marks are posted as `rallypoint run` posts them. The real
`run` reading a job's progress file is tests/inprocess/test_attempts.py's, and a real gloo
job's stall on namespace hosts is tests/multihost/test_stall.py's.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from tests.support.cluster.inprocess import Cluster, ready_cluster, until
from tests.support.commands import start_rallypoint

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes

TOKEN = "progress-test-secret"
#: A keep-alive every 0.2 s: a mark reaches the master within a moment.
FAST = {"keepalive_s": 0.2}
LOOP = Path(__file__).parents[2] / "docs" / "examples" / "train_loop.sh"


def progress(c: Cluster, rank: int) -> dict[str, Any]:
    view = msgspec.to_builtins(c.nodes[rank].node.job_status())["progress"]
    assert isinstance(view, dict)
    return view


async def post(
    c: Cluster, rank: int, body: bytes, content_type: str = "application/json", proof: bool = True
) -> aiohttp.ClientResponse:
    """POST /job/progress as `run` does (``proof``: with the token's proof)."""
    headers = {"Content-Type": content_type, **(c.write_headers() if proof else {})}
    async with aiohttp.ClientSession() as session:
        url = c.local_url(rank, "/job/progress")
        async with session.post(url, data=body, headers=headers) as answer:
            await answer.read()
            return answer


def mark(step: int, at: float, phase: str = "step") -> bytes:
    return f'{{"attempt": 0, "at": {at}, "step": {step}, "phase": "{phase}"}}'.encode()


async def test_every_nodes_last_mark_reaches_the_master_and_every_node_sees_who_is_behind() -> None:
    now = time.time()
    async with ready_cluster(3, token=TOKEN, per_node={r: dict(FAST) for r in range(3)}) as c:
        for rank, (step, at) in enumerate(((12, now), (12, now + 0.01), (11, now - 5.0))):
            assert (await post(c, rank, mark(step, at, "data"))).status == 204
        await until(lambda: progress(c, 0)["marked"] == 3 and progress(c, 1)["marked"] == 3)
        master = progress(c, 0)
        assert [(m["host"], m["step"]) for m in master["nodes"]] == [
            ("node0", 12),
            ("node1", 12),
            ("node2", 11),
        ]
        for rank in range(3):
            await until(lambda rank=rank: progress(c, rank)["marked"] == 3)  # type: ignore[misc]
            view = progress(c, rank)
            assert [m["host"] for m in view["oldest"]] == ["node2", "node0"], view
            assert view["newest"]["host"] == "node1", view
            assert view["behind"] == (
                "node2 (rank 2) is behind: its last progress was step 11 (data), every other"
                " node's later"
            )
            assert view["oldest"][0]["age_s"] >= 5.0
        # A worker holds its own mark only; the master alone holds every node's.
        assert [m["host"] for m in progress(c, 1)["nodes"]] == ["node1"]


async def test_a_later_mark_moves_on_and_bad_reports_change_nothing() -> None:
    now = time.time()
    async with ready_cluster(2, token=TOKEN, per_node={r: dict(FAST) for r in range(2)}) as c:
        assert (await post(c, 1, mark(3, now))).status == 204
        await until(lambda: [m["step"] for m in progress(c, 0)["nodes"]] == [3])
        for body, status in (
            (b"not json", 400),
            (b'{"attempt": 0, "at": 1.0, "phase": "two words"}', 400),
            (b'{"attempt": -1, "at": 1.0}', 400),
            (b"x" * 4096, 413),
        ):
            answer = await post(c, 1, body)
            assert answer.status == status, (body, answer.status)
        # A local user without the session token: refused, and the mark goes nowhere.
        assert (await post(c, 1, mark(9, now + 2), proof=False)).status == 403
        assert (await post(c, 1, mark(4, now + 1))).status == 204
        assert (await post(c, 1, b"{}", content_type="text/plain")).status == 415
        await until(lambda: [m["step"] for m in progress(c, 0)["nodes"]] == [4])
        assert (await post(c, 1, mark(2, now - 10))).status == 204  # older: kept out
        await until(lambda: progress(c, 1)["nodes"][0]["step"] == 4)
        assert [m["step"] for m in progress(c, 0)["nodes"]] == [4]


async def test_the_shell_example_runs_to_its_end_and_every_nodes_last_step_is_shown() -> None:
    """docs/examples/train_loop.sh under `run --stall-timeout 2` on two nodes: 12 steps of
    0.1 s, never stalled; the master shows each node's last step, 12."""
    async with ready_cluster(2, token=TOKEN, per_node={r: dict(FAST) for r in range(2)}) as c:
        procs = [
            await start_rallypoint(
                "run",
                "--quiet",
                "--timeout",
                "60",
                "--local-port",
                c.local_url(rank, "").rsplit(":", 1)[1],
                "--stall-timeout",
                "2",
                "--",
                "sh",
                str(LOOP),
                "12",
                env=c.run_env(),
            )
            for rank in range(2)
        ]
        async with asyncio.timeout(60.0):
            outs = [await proc.communicate() for proc in procs]
        for proc, (stdout, stderr) in zip(procs, outs, strict=True):
            assert proc.returncode == 0, stderr.decode()
            assert "done after 12 steps" in stdout.decode()
        await until(lambda: [m["step"] for m in progress(c, 0)["nodes"]] == [12, 12])
