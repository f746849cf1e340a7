"""GET /hostfile through aiohttp's test client, checked against docs/openapi.yaml."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.net import ports
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.local import local_app
from rallypoint.server.peer import peer_app
from rallypoint.settings import Settings
from tests.fakes import FakeResolver
from tests.support.api import SESSION, Client, checked, join_while_waiting, not_ready

MakeNode = Callable[..., Awaitable[Rendezvous]]


async def test_hostfile_lists_every_node_in_rank_order_once_ready(
    aiohttp_client: Client, make_node: MakeNode
) -> None:
    node = await make_node(nnodes=2, nproc_per_node=4)
    peer = await aiohttp_client(peer_app(node))
    local = await aiohttp_client(local_app(node))
    await asyncio.sleep(0)
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


async def test_a_word_for_the_process_count_gives_no_hostfile(aiohttp_client: Client) -> None:
    settings = Settings(
        mdns=False,
        deadline_s=20.0,
        resolve_timeout_s=1.0,
        frameworks=frozenset({"torch"}),
        probe=False,  # the API is under test here, not the connection probes
    )
    spec = ClusterSpec("explicit", ("node0",), 0, 1, "sess-hostfile", loopback_ok=True)
    with ports.reserve([], settings.port_range) as master:
        node = Rendezvous(
            spec,
            settings,
            resolver=FakeResolver({"node0": ["127.0.0.1"]}),
            auth=Authenticator(None),
            metrics=Metrics(),
            addresses=["127.0.0.1"],
            held={"master": master},
            user={"PET_NPROC_PER_NODE": ("gpu", "--set")},
        )
        async with node:
            await aiohttp_client(peer_app(node))
            local = await aiohttp_client(local_app(node))
            assert await node.readiness.wait_ready(20)
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
