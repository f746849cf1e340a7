"""GET /mesh on a cluster in one event loop: a cut pair is one cell, on the master and elsewhere."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from click.testing import Result

from tests.support.api import checked
from tests.support.cli import run
from tests.support.cluster.inprocess import Cluster, all_ready, until
from tests.support.steered import FAST, Steered, closed_port, start_steered


async def get_mesh(c: Cluster, rank: int) -> tuple[int, dict[str, Any]]:
    """GET /mesh on one node, its answer checked against docs/openapi.yaml."""
    async with aiohttp.ClientSession() as http, http.get(c.local_url(rank, "/mesh")) as answer:
        return answer.status, json.loads(await checked(answer, "GET", "/mesh"))


async def status_mesh(c: Cluster, rank: int) -> Result:
    """`rallypoint status --mesh` against one node (in a thread: the cluster runs in this loop)."""
    args = ["status", "--mesh", "--url", c.local_url(rank, "")]
    return await asyncio.to_thread(run, args)


async def one_error_line(c: Cluster, rank: int, start: str) -> None:
    """`status --mesh` on ``rank`` exits 1 with one error line that starts with ``start``."""
    result = await status_mesh(c, rank)
    assert result.exit_code == 1
    assert result.stderr.startswith(start) and len(result.stderr.splitlines()) == 1, result.stderr


async def test_a_cut_pair_is_one_failed_cell_seen_from_every_node() -> None:
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    c.detours[(1, "node2")] = ("127.0.0.1", closed_port())  # node1 -> node2 is refused
    try:
        await start_steered(c)

        def cut_seen() -> bool:
            book = c.nodes[0].node.book
            if book is None:
                return False
            reports = book.verdict.reports
            return len(reports) == 3 and bool(reports[1].failures)

        await until(cut_seen)
        for rank in range(3):  # the workers ask the master for its view
            status, doc = await get_mesh(c, rank)
            assert status == 200
            assert doc["matrix"] == ["\\..", ".\\R", "..\\"]
            assert doc["counts"] == {
                "passed": 5,
                "failed": 1,
                "checking": 0,
                "unknown": 0,
                "not_tried": 0,
            }
            (pair,) = doc["pairs"]
            assert (pair["from_host"], pair["to_host"], pair["cause"]) == (
                "node1",
                "node2",
                "refused",
            )
            assert [n["host"] for n in doc["nodes"]] == ["node1"]
        # The command a person runs on the worker shows the same cell and exits 1.
        result = await status_mesh(c, 2)
        assert result.exit_code == 1, result.output
        assert "1 node1    . \\ R" in result.output
        assert "1 -> 2  refused: node1 cannot reach node2" in result.output
        # Repaired: every pair passed, and the command exits 0.
        del c.detours[(1, "node2")]
        await all_ready(c)
        status, doc = await get_mesh(c, 1)
        assert status == 200 and doc["counts"]["passed"] == 6 and doc["nodes"] == []
        result = await status_mesh(c, 1)
        assert result.exit_code == 0, result.output
    finally:
        await c.close()


async def test_a_worker_that_has_not_reached_its_master_says_so() -> None:
    c = Cluster(2)
    try:
        await c.start(1)  # the master never starts
        status, doc = await get_mesh(c, 1)
        assert status == 409 and doc["code"] == "no_master"
        assert "has not reached its master yet" in doc["error"]
        await one_error_line(c, 1, "error: this node has not reached its master yet")
    finally:
        await c.close()


async def test_a_worker_whose_master_is_gone_says_it_cannot_ask() -> None:
    c = Cluster(2)
    try:
        await c.start(0)
        await c.start(1)
        await all_ready(c)
        await c.stop(0)
        status, doc = await get_mesh(c, 1)
        assert status == 502 and doc["code"] == "no_master"
        assert doc["error"].startswith("cannot get the mesh from the master node0: ")
        await one_error_line(c, 1, "error: cannot get the mesh from the master node0")
    finally:
        await c.close()


async def test_through_a_relay_whose_master_is_gone_the_cause_is_said_once() -> None:
    # Groups of 2 over 5 ranks: rank 2 relays for rank 3, which asks its relay for the mesh.
    c = Cluster(5, per_node={rank: {"relay_group_size": 2} for rank in range(5)})
    try:
        for rank in range(5):
            await c.start(rank)
        await all_ready(c)
        assert c.nodes[3].node.master_target == ("127.0.0.1", c.peer_ports["node2"])
        await c.stop(0)
        status, doc = await get_mesh(c, 3)
        assert status == 502 and doc["code"] == "no_master"
        assert doc["error"].startswith("cannot get the mesh from the master node0: ")
        assert doc["error"].count("cannot get the mesh") == 1, doc["error"]
    finally:
        await c.close()
