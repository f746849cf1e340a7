"""Both APIs through aiohttp's test client; every answer is checked against docs/openapi.yaml."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import jsonschema  # type: ignore[import-untyped]
import pytest

from rallypoint import server, wire
from rallypoint.auth import Authenticator
from rallypoint.model import ClusterSpec
from rallypoint.net import netinfo
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.local import local_app
from rallypoint.server.peer import PEER_MAX_BYTES, peer_app
from rallypoint.settings import Settings
from rallypoint.sidecar import Sidecar
from rallypoint.wire import cluster
from tests.conftest import require
from tests.fakes import FakeResolver
from tests.support.api import (
    OPENAPI,
    SESSION,
    Client,
    MakeApis,
    checked,
    join_body,
    join_while_waiting,
    not_ready,
)


def test_openapi_schemas_are_valid_json_schema() -> None:
    assert OPENAPI["openapi"].startswith("3.1")
    for schema in OPENAPI["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("fmt", ["json", "sh", "dotenv"])
async def test_env_when_ready(make_apis: MakeApis, fmt: str) -> None:
    apis = await make_apis()
    node, local = apis.node, apis.local
    resp = await local.get("/env", params={"format": fmt})
    assert resp.status == 200
    body = (await checked(resp, "GET", "/env")).decode()
    assert resp.headers["X-Rallypoint-Generation"] == node.verification.generation
    master_port = str(node.held["master"].port)
    expected = {
        "json": f'"MASTER_PORT": "{master_port}"',
        "sh": f"export MASTER_PORT={master_port}",
        "dotenv": f"MASTER_PORT={master_port}",
    }[fmt]
    assert expected in body


async def test_env_not_ready_then_wait_until_a_join(make_apis: MakeApis) -> None:
    apis = await make_apis(nnodes=2, ready=False)
    node, peer, local = apis.node, apis.peer, apis.local
    body = await not_ready(local, "/env")
    assert body["reasons"][0]["code"] == "waiting_for_join"
    assert body["reasons"][0]["ranks"] == [1]
    resp = await local.get("/readyz")
    assert resp.status == 503
    assert (await checked(resp, "GET", "/readyz")).startswith(b"not ready: waiting_for_join")

    waiting, answer = await join_while_waiting(local, peer, "/env")
    assert answer.joined == 2 and answer.epoch == node.epoch
    assert answer.generation is not None
    await asyncio.sleep(0.05)
    assert not waiting.done()  # joined is not verified: the worker has not reported yet
    report = wire.Report(SESSION, answer.generation, 1, "node1", passed=True)
    resp = await peer.post("/v1/report", data=wire.encode_report(report))
    verdict = wire.parse_verdict(await checked(resp, "POST", "/v1/report"))
    assert verdict.generation == answer.generation
    resp = await waiting
    assert resp.status == 200
    env = json.loads(await checked(resp, "GET", "/env"))
    assert env["WORLD_SIZE"] == "2"
    resp = await local.get("/readyz")
    assert (await checked(resp, "GET", "/readyz")) == b"ready\n"


@pytest.mark.parametrize(
    "query",
    [
        {"format": "xml"},
        {"wait": "soon"},
        {"wait": "-1"},
        {"wait": "nan"},
        {"wait": "inf"},
        {"verbose": "1"},
        [("format", "json"), ("format", "sh")],
    ],
    ids=["format", "wait-text", "wait-negative", "wait-nan", "wait-inf", "unknown", "twice"],
)
async def test_env_bad_parameters(
    aiohttp_client: Client,
    make_node: Callable[..., Awaitable[Rendezvous]],
    query: dict[str, str] | list[tuple[str, str]],
) -> None:
    node = await make_node()
    local = await aiohttp_client(local_app(node))
    resp = await local.get("/env", params=query)
    assert resp.status == 400
    body = await checked(resp, "GET", "/env")
    assert b"\n" not in body.strip()
    assert json.loads(body)["error"]


async def test_livez_status_and_metrics(make_apis: MakeApis) -> None:
    apis = await make_apis()
    node, local = apis.node, apis.local
    resp = await local.get("/livez")
    assert await checked(resp, "GET", "/livez") == b"ok\n"
    resp = await local.get("/status")
    status = json.loads(await checked(resp, "GET", "/status"))
    assert status["ready"] is True and status["role"] == "master"
    assert status["ports"]["master"]["port"] == node.held["master"].port
    assert status["peers"][0]["verdict"] == "loopback"
    resp = await local.get("/metrics")
    text = (await checked(resp, "GET", "/metrics")).decode()
    assert "rallypoint_ready 1.0" in text
    assert 'rallypoint_http_requests_total{api="local",route="/status",status="200"} 1.0' in text


async def test_peer_ready_cluster_and_poke(
    aiohttp_client: Client, make_node: Callable[..., Awaitable[Rendezvous]]
) -> None:
    node = await make_node(nnodes=2, long_poll_s=0.2)
    peer = await aiohttp_client(peer_app(node))
    resp = await peer.get("/v1/ready")
    assert json.loads(await checked(resp, "GET", "/v1/ready")) == {"ready": False}
    resp = await peer.get("/v1/cluster")
    assert resp.status == 204
    await checked(resp, "GET", "/v1/cluster")
    resp = await peer.post("/v1/join", data=join_body())
    await checked(resp, "POST", "/v1/join")
    resp = await peer.get("/v1/cluster")
    doc = cluster.parse_cluster_doc(await checked(resp, "GET", "/v1/cluster"))
    assert (
        doc.generation == node.verification.generation
        and doc.master_port == node.held["master"].port
    )
    resp = await peer.get("/v1/cluster", params={"after": doc.generation})
    assert resp.status == 204
    poke = wire.encode_poke(wire.Poke(SESSION, "abc"))
    resp = await peer.post("/v1/poke", data=poke)
    assert resp.status == 204
    await checked(resp, "POST", "/v1/poke")
    assert node.metrics.value("rallypoint_pokes_received_total") == 1


@pytest.mark.parametrize(
    ("method", "path", "data", "params", "status"),
    [
        ("POST", "/v1/join", b"{not json", None, 400),
        ("POST", "/v1/join", b"[]", None, 400),
        ("POST", "/v1/join", join_body(host="evil"), None, 403),
        ("POST", "/v1/join", join_body(session="other"), None, 409),
        ("POST", "/v1/join", b"x" * (PEER_MAX_BYTES + 1), None, 413),
        ("GET", "/v1/cluster", None, {"after": "no spaces"}, 400),
        ("POST", "/v1/poke", wire.encode_poke(wire.Poke("other", "abc")), None, 409),
        ("POST", "/v1/poke", b'{"session": 1}', None, 400),
        ("POST", "/v1/report", b'{"session": "sess-api"}', None, 400),
        (
            "POST",
            "/v1/report",
            wire.encode_report(wire.Report(SESSION, "gen.1", 1, "node1", passed=True)),
            None,
            409,
        ),
    ],
    ids=[
        "join-json",
        "join-shape",
        "impostor",
        "session",
        "too-large",
        "after",
        "poke-session",
        "poke-shape",
        "report-shape",
        "report-stale",
    ],
)
async def test_peer_rejections(
    aiohttp_client: Client,
    make_node: Callable[..., Awaitable[Rendezvous]],
    method: str,
    path: str,
    data: bytes | None,
    params: dict[str, str] | None,
    status: int,
) -> None:
    node = await make_node(nnodes=2, long_poll_s=0.2)
    peer = await aiohttp_client(peer_app(node))
    resp = await peer.request(method, path, data=data, params=params)
    assert resp.status == status
    await checked(resp, method, path)


async def test_peer_requests_need_a_signature_when_a_token_is_set(
    aiohttp_client: Client, make_node: Callable[..., Awaitable[Rendezvous]]
) -> None:
    node = await make_node(nnodes=2, token="t0ken", long_poll_s=0.2)
    peer = await aiohttp_client(peer_app(node))
    signer = Authenticator("t0ken")
    for path in ("/v1/ready", "/v1/cluster", "/v1/mesh"):
        resp = await peer.get(path)
        assert resp.status == 401
        await checked(resp, "GET", path)
    resp = await peer.get("/v1/ready", headers=signer.sign("GET /v1/ready", b""))
    assert json.loads(await checked(resp, "GET", "/v1/ready")) == {"ready": False}
    body = join_body()
    resp = await peer.post("/v1/join", data=body, headers=signer.sign("POST /v1/join", body))
    payload = await checked(resp, "POST", "/v1/join")
    signer.verify("200 /v1/join", payload, resp.headers)
    assert node.metrics.value("rallypoint_auth_failures_total", reason="unsigned") == 3


async def test_local_api_is_not_reachable_on_other_addresses() -> None:
    others = netinfo.local_addresses()
    require(bool(others), "this host has no non-loopback address")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local_port = int(probe.getsockname()[1])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        peer_port = int(probe.getsockname()[1])
    settings = Settings(
        local_port=local_port,
        peer_host="127.0.0.1",
        peer_port=peer_port,
        mdns=False,
        deadline_s=20.0,
    )
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    resolver = FakeResolver({"node0": ["127.0.0.1"]})
    async with Sidecar(settings, {}, resolver=resolver, spec=spec, addresses=[]) as sidecar:
        assert await sidecar.node.readiness.wait_ready(20)
        assert sidecar.listeners is not None
        assert ("127.0.0.1", local_port) in sidecar.listeners.local_bound
        _, writer = await asyncio.open_connection("127.0.0.1", local_port)
        writer.close()
        for address in others:
            with pytest.raises(OSError):
                _, writer = await asyncio.open_connection(address, local_port)
                writer.close()


@pytest.mark.parametrize(
    ("nnodes", "expected_s"),
    [(0, 5.0), (2, 5.004), (64, 5.128), (4096, 13.192), (16384, 37.768), (65536, 60.0)],
)
def test_peer_keepalive_grows_with_the_cluster_and_is_capped(
    nnodes: int, expected_s: float
) -> None:
    # aiohttp's keep-alive timer also bounds a fresh connection's first request: in a herd
    # the master must reach every connection before it fires (docs/performance.md).
    assert server.peer_keepalive_s(nnodes) == pytest.approx(expected_s)
    assert server.KEEPALIVE_S <= server.peer_keepalive_s(nnodes) <= server.KEEPALIVE_MAX_S


async def test_every_route_of_both_apis_is_in_the_openapi_document(
    make_node: Callable[..., Awaitable[Rendezvous]],
) -> None:
    node = await make_node()
    served = {
        (route.method.lower(), route.resource.canonical)
        for app in (local_app(node), peer_app(node, run_rendezvous=False))
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    documented = {(m, p) for p, ops in OPENAPI["paths"].items() for m in ops if m != "parameters"}
    assert len(served) >= 15
    assert sorted(served - documented) == []


async def test_job_routes_answer_as_documented(make_apis: MakeApis) -> None:
    """GET /job, its long-poll, POST /job and its refusals, /status "job": each as documented."""
    local = (await make_apis()).local
    resp = await local.get("/job")
    view = json.loads(await checked(resp, "GET", "/job"))
    assert view["own"]["state"] == "waiting" and view["first"] is None and view["stop"] is False
    assert view["carried"] is True and view["counts"]["waiting"] == 1

    json_body = {"Content-Type": "application/json"}
    running = json.dumps({"state": "running", "started": 1000.0})
    resp = await local.post("/job", data=running, headers=json_body)
    view = json.loads(await checked(resp, "POST", "/job"))
    assert view["own"]["state"] == "running" and view["nodes"][0]["rank"] == 0

    # A long-poll for a version after this one returns when the job ends.
    waiting = asyncio.ensure_future(
        local.get("/job", params={"after": str(view["version"]), "wait": "20"})
    )
    await asyncio.sleep(0.05)
    assert not waiting.done()
    ended = json.dumps({"state": "exited", "started": 1000.0, "code": 3})
    resp = await local.post("/job", data=ended, headers=json_body)
    await checked(resp, "POST", "/job")
    resp = await waiting
    view = json.loads(await checked(resp, "GET", "/job"))
    assert view["first"]["what"] == "exited 3" and view["first"]["code"] == 3
    assert view["stop"] is False  # this node's own failure does not stop this node
    resp = await local.get("/status")
    status = json.loads(await checked(resp, "GET", "/status"))
    assert status["job"]["version"] == view["version"]
    text = (await checked(await local.get("/metrics"), "GET", "/metrics")).decode()
    assert 'rallypoint_job_failures_total{cause="exited"} 1.0' in text

    refusals = [
        (running, {"Content-Type": "text/plain"}, 415),
        (running, None, 415),
        ('{"state": "exploded", "started": 1}', json_body, 400),
        ('{"state": "exited", "started": 1}', json_body, 400),
        ("{not json", json_body, 400),
        ("x" * 2000, json_body, 413),
    ]
    for data, headers, status_code in refusals:
        resp = await local.post("/job", data=data, headers=headers)
        assert resp.status == status_code, data
        await checked(resp, "POST", "/job")
    for params in ({"after": "x"}, {"after": "1", "wait": "-1"}, {"verbose": "1"}):
        resp = await local.get("/job", params=params)
        assert resp.status == 400
        await checked(resp, "GET", "/job")
