"""GET /hostfile through aiohttp's test client, checked against docs/openapi.yaml."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest

from rallypoint import wire
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.local import local_app
from tests.support.api import (
    SESSION,
    Client,
    MakeApis,
    checked,
    join_while_waiting,
    not_ready,
)

MakeNode = Callable[..., Awaitable[Rendezvous]]


async def test_hostfile_lists_every_node_in_rank_order_once_ready(make_apis: MakeApis) -> None:
    apis = await make_apis(nnodes=2, nproc_per_node=4, ready=False)
    node, peer, local = apis.node, apis.peer, apis.local
    body = await not_ready(local, "/hostfile")
    assert body["reasons"][0]["code"] == "waiting_for_join"

    waiting, answer = await join_while_waiting(local, peer, "/hostfile")
    assert answer.generation is not None
    # Ready needs the worker's report of its checks (the cluster-wide verdict).
    report = wire.Report(SESSION, answer.generation, 1, "node1", passed=True)
    assert (await peer.post("/v1/report", data=wire.encode_report(report))).status == 200
    resp = await waiting
    assert resp.status == 200
    text = (await checked(resp, "GET", "/hostfile")).decode()
    assert text == "node0 slots=4\nnode1 slots=4\n"
    assert resp.headers["X-Rallypoint-Generation"] == node.verification.generation


async def test_a_word_for_the_process_count_gives_no_hostfile(make_apis: MakeApis) -> None:
    user = {"PET_NPROC_PER_NODE": ("gpu", "--set")}
    local = (await make_apis(frameworks=frozenset({"torch"}), user=user)).local
    env = json.loads(await checked(await local.get("/env"), "GET", "/env"))
    assert env["PET_NPROC_PER_NODE"] == "gpu"
    resp = await local.get("/hostfile")
    assert resp.status == 409
    body = json.loads(await checked(resp, "GET", "/hostfile"))
    assert "PET_NPROC_PER_NODE='gpu'" in body["error"]
    assert body["code"] == "no_hostfile"


@pytest.mark.parametrize("query", [{"wait": "soon"}, {"format": "json"}])
async def test_hostfile_bad_parameters(
    aiohttp_client: Client, make_node: MakeNode, query: dict[str, str]
) -> None:
    node = await make_node()
    local = await aiohttp_client(local_app(node))
    resp = await local.get("/hostfile", params=query)
    assert resp.status == 400
    assert json.loads(await checked(resp, "GET", "/hostfile"))["error"]
