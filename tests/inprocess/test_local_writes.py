"""Writes to the local API prove the session token; reads stay open (docs/api.md "Writes").

On a shared host (Slurm without containers, host-network pods) every local user reaches
127.0.0.1: with a token set, only a process that has it (`rallypoint run`, from the same
RALLYPOINT_TOKEN) can report a job, so no other user can stop this session's job.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

from rallypoint.wire import jobstates
from tests.support.cluster.inprocess import Cluster, ready_cluster, until
from tests.support.commands import start_rallypoint

#: Starts the product's processes: no machine-measuring test runs beside it (conftest.py).
pytestmark = pytest.mark.starts_processes

TOKEN = "local-writes-test-secret"
FAST = {"keepalive_s": 0.3}


async def start_run(
    c: Cluster, rank: int, script: str, env: dict[str, str]
) -> asyncio.subprocess.Process:
    return await start_rallypoint(
        "run", "--local-port", c.local_url(rank, "").rsplit(":", 1)[1],
        "--timeout", "30", "--quiet", "--grace", "2", "--", "sh", "-c", script,
        env=env,
    )  # fmt: skip


async def post_job(c: Cluster, rank: int, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        url = c.local_url(rank, "/job")
        headers = {"Content-Type": "application/json", **headers}
        async with session.post(url, data=body, headers=headers) as answer:
            return answer.status, await answer.text()


async def test_a_process_without_the_token_cannot_stop_the_job() -> None:
    """While a job runs on both nodes, a failure report without the token's proof, or with
    another token's, gets 403 and one line, and the job runs to its end (exit 0 on both)."""
    async with ready_cluster(2, token=TOKEN, per_node={r: dict(FAST) for r in range(2)}) as c:
        runs = [await start_run(c, r, "sleep 3", c.run_env()) for r in range(2)]
        await until_running(c)
        failed = jobstates.encode_report(jobstates.Report("exited", time.time(), code=1, attempt=0))
        wrong = Cluster(2, token="another-secret").write_headers()
        for headers in ({}, wrong, {"Authorization": "Basic dXNlcjpwYXNz"}):
            status, text = await post_job(c, 1, failed, headers)
            assert status == 403, text
            error = json.loads(text)["error"]
            assert "token" in error and "\n" not in error, error
        # Reads stay open on loopback.
        async with aiohttp.ClientSession() as session:
            for path in ("/env", "/job", "/status"):
                async with session.get(c.local_url(1, path)) as answer:
                    assert answer.status == 200, path
        async with asyncio.timeout(60.0):
            ends = [await proc.communicate() for proc in runs]
        assert [proc.returncode for proc in runs] == [0, 0], ends
        view = c.nodes[0].node.job_status()
        assert view.first is None and view.own is not None and view.own.code == 0, view  # type: ignore[union-attr]


async def test_run_without_the_token_exits_2_with_one_line_and_starts_nothing() -> None:
    async with ready_cluster(1, token=TOKEN) as c:
        proc = await start_run(c, 0, "echo STARTED", {})
        async with asyncio.timeout(30.0):
            stdout, stderr = await proc.communicate()
    text = stderr.decode()
    assert proc.returncode == 2, text
    assert len(text.strip().splitlines()) == 1, text
    assert "refused POST /job" in text and "RALLYPOINT_TOKEN" in text, text
    assert b"STARTED" not in stdout


async def until_running(c: Cluster) -> None:
    """Until the master's job view has both nodes' jobs running."""

    def running() -> bool:
        nodes = c.nodes[0].node.job_status().nodes  # type: ignore[union-attr]
        return len(nodes) == 2 and all(n.state == "running" for n in nodes)

    await until(running, timeout_s=30.0)
