"""The OpenAPI document as a checker of answers, and the node, its APIs and the join body the
API tests use."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import yaml  # type: ignore[import-untyped]
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from rallypoint import wire
from rallypoint.model import Member
from rallypoint.rendezvous.node import Rendezvous

OPENAPI = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml").read_text()
)
SESSION = "sess-api"
HOSTS = ("node0", "node1")
Client = Callable[..., Awaitable[TestClient[Any, Any]]]


@dataclass
class Apis:
    """A node behind both its APIs, each through aiohttp's test client (the in-process
    tier's ``make_apis`` fixture)."""

    node: Rendezvous
    peer: TestClient[Any, Any]
    local: TestClient[Any, Any]


MakeApis = Callable[..., Awaitable[Apis]]


async def checked(resp: ClientResponse, method: str, path: str) -> bytes:
    """The body, after checking status, content type and JSON body against the document."""
    body = await resp.read()
    operation = OPENAPI["paths"][path][method.lower()]
    declared = operation["responses"].get(str(resp.status))
    assert declared is not None, f"{method} {path} -> {resp.status} is not documented"
    if "$ref" in declared:
        declared = OPENAPI["components"]["responses"][declared["$ref"].rsplit("/", 1)[1]]
    content = declared.get("content")
    if not content:
        assert not body, f"{method} {path} -> {resp.status} documents no body"
        return body
    media = resp.content_type
    assert media in content, f"{method} {path} -> {resp.status}: {media} not documented"
    schema = dict(content[media]["schema"], components=OPENAPI["components"])
    value: object = json.loads(body) if media == "application/json" else body.decode()
    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
    return body


async def not_ready(local: TestClient[Any, Any], path: str) -> dict[str, Any]:
    """GET ``path`` of the local API: 503, with its documented body, parsed."""
    resp = await local.get(path)
    assert resp.status == 503
    body: dict[str, Any] = json.loads(await checked(resp, "GET", path))
    return body


async def join_while_waiting(
    local: TestClient[Any, Any], peer: TestClient[Any, Any], path: str
) -> tuple[asyncio.Future[ClientResponse], wire.JoinAnswer]:
    """A long-poll of ``path`` that is still waiting, then node1's join: both, to await on."""
    waiting = asyncio.ensure_future(local.get(path, params={"wait": "60"}))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    join = await peer.post("/v1/join", data=join_body())
    assert join.status == 200
    return waiting, wire.parse_join_answer(await checked(join, "POST", "/v1/join"))


def join_body(session: str = SESSION, host: str = "node1") -> bytes:
    return wire.encode_join(wire.JoinRequest(session, Member(1, host, ("127.0.0.2",), 2300)))
