"""GET /v1/cluster: one encoding per generation, gzip when offered, signed over the JSON."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec, Member
from rallypoint.net import ports
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.peer import peer_app
from rallypoint.wire import cluster
from tests.fakes import FakeResolver
from tests.support.settings import fast_settings

SESSION = "sess-encoding"
TOKEN = "encoding-t0ken"
NNODES = 24  # enough members for a document above masterbook.GZIP_MIN_BYTES
HOSTS = tuple(f"node{rank}" for rank in range(NNODES))
Client = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
async def master() -> AsyncIterator[Rendezvous]:
    settings = fast_settings(token=TOKEN, long_poll_s=0.5, resolve_timeout_s=0.2, backoff_max_s=0.1)
    spec = ClusterSpec("explicit", HOSTS, 0, NNODES, SESSION, loopback_ok=True)
    held = {
        "master": ports.reserve([], settings.port_range),
        "tf": ports.reserve([], settings.port_range),
    }
    node = Rendezvous(
        spec,
        settings,
        resolver=FakeResolver({"node0": ["127.0.0.1"]}),
        auth=Authenticator(TOKEN),
        metrics=Metrics(),
        addresses=["127.0.0.1"],
        held=held,
        user={},
    )
    await node.__aenter__()
    yield node
    await node.close()
    for port in held.values():
        port.close()


async def _join_all(peer: TestClient[Any, Any], signer: Authenticator) -> None:
    for rank in range(1, NNODES):
        member = Member(rank, HOSTS[rank], (f"127.0.1.{rank}",), 2222)
        body = wire.encode_join(wire.JoinRequest(SESSION, member))
        resp = await peer.post("/v1/join", data=body, headers=signer.sign("POST /v1/join", body))
        assert resp.status == 200, await resp.text()


@pytest.mark.parametrize(
    ("accept", "encoding"),
    [("gzip, deflate", "gzip"), ("identity", None), ("gzip;q=0", None)],
)
async def test_cluster_document_encodings(
    aiohttp_client: Client, master: Rendezvous, accept: str, encoding: str | None
) -> None:
    peer = await aiohttp_client(peer_app(master))
    signer = Authenticator(TOKEN)
    await _join_all(peer, signer)
    assert master.book is not None and master.book.encoded_doc is not None
    expected = master.book.encoded_doc.body
    for _ in range(2):  # two answers: same bytes, each with its own fresh signature
        headers = {"Accept-Encoding": accept, **signer.sign("GET /v1/cluster?after=", b"")}
        resp = await peer.get("/v1/cluster", headers=headers, auto_decompress=False)
        assert resp.status == 200
        assert resp.headers.get("Content-Encoding") == encoding
        assert resp.headers.get("Vary") == "Accept-Encoding"
        raw = await resp.read()
        body = gzip.decompress(raw) if encoding == "gzip" else raw
        assert body == expected
        signer.verify("200 /v1/cluster", body, resp.headers)
        doc = cluster.parse_cluster_doc(body)
        assert [m.host for m in doc.members] == list(HOSTS)
