"""With a session secret: forged, stale, replayed and tampered peer traffic is refused, counted."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web

from rallypoint import wire
from rallypoint.auth import SIGNATURE_HEADER, Authenticator
from rallypoint.mdns.announce import Mdns
from rallypoint.model import ClusterDoc, Member
from rallypoint.wire import cluster
from tests.hardening.harness import (
    SESSION,
    LoopThread,
    Node,
    Records,
    free_port,
    request,
    start_node,
)

TOKEN = "hardening-secret-" + uuid.uuid4().hex
WAIT_S = 20.0


def metric(port: int, name: str, **labels: str) -> float:
    """One sample of the sidecar's /metrics (0.0 when absent), read over HTTP."""
    text = request(port, "GET", "/metrics").body.decode()
    label_text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    wanted = f"{name}{{{label_text}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def signed_master(loop_thread: LoopThread, logs: Records) -> Iterator[Node]:
    node = loop_thread.run(start_node(["node0", "node1", "node2"], token=TOKEN))
    yield node
    loop_thread.run(node.sidecar.stop())


def join(rank: int = 1, host: str = "node1") -> bytes:
    return wire.encode_join(wire.JoinRequest(SESSION, Member(rank, host, ("127.0.0.1",), None)))


def stale_signer() -> Authenticator:
    return Authenticator(TOKEN, clock=lambda: time.time() - 600)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("unsigned", "unsigned"),
        ("stale", "stale"),
        ("replayed", "replayed"),
        ("tampered", "bad_signature"),
        ("wrong-key", "bad_signature"),
        ("other-route", "bad_signature"),
        ("malformed", "malformed"),
    ],
)
def test_bad_joins_are_refused_and_counted(
    signed_master: Node, logs: Records, case: str, reason: str
) -> None:
    port = signed_master.peer_port
    before = metric(signed_master.local_port, "rallypoint_auth_failures_total", reason=reason)
    body = join()
    headers: dict[str, str] = {"Content-Type": "application/json"}
    if case == "stale":
        headers.update(stale_signer().sign("POST /v1/join", body))
    elif case in ("replayed", "tampered", "malformed"):
        headers.update(Authenticator(TOKEN).sign("POST /v1/join", body))
    elif case == "wrong-key":
        headers.update(Authenticator("not-" + TOKEN).sign("POST /v1/join", body))
    elif case == "other-route":
        headers.update(Authenticator(TOKEN).sign("POST /v1/poke", body))
    if case == "replayed":
        first = request(port, "POST", "/v1/join", body=body, headers=headers)
        assert first.status == 200, first.body
    if case == "tampered":
        body = body.replace(b"127.0.0.1", b"127.0.0.9")
    if case == "malformed":
        headers[SIGNATURE_HEADER] = "zz" + headers[SIGNATURE_HEADER][2:]
    reply = request(port, "POST", "/v1/join", body=body, headers=headers)
    assert reply.status == 401, (case, reply.status, reply.body)
    assert json.loads(reply.body)["code"] == "auth_failed"
    assert TOKEN.encode() not in reply.body
    after = metric(signed_master.local_port, "rallypoint_auth_failures_total", reason=reason)
    assert after == before + 1, f"{case}: rallypoint_auth_failures_total{{reason={reason}}}"
    assert not logs.crashes()


@pytest.mark.parametrize("path", ["/v1/ready", "/v1/cluster", "/v1/poke"])
def test_unsigned_requests_on_every_peer_route_are_refused(signed_master: Node, path: str) -> None:
    before = metric(signed_master.local_port, "rallypoint_auth_failures_total", reason="unsigned")
    method = "POST" if path == "/v1/poke" else "GET"
    body = wire.encode_poke(wire.Poke(SESSION, "e1")) if method == "POST" else None
    reply = request(signed_master.peer_port, method, path, body=body)
    assert reply.status == 401
    after = metric(signed_master.local_port, "rallypoint_auth_failures_total", reason="unsigned")
    assert after == before + 1


# -- a fake master serving forged answers to a real worker -----------------------------------


class FakeMaster:
    """A peer API that answers joins and serves a cluster document, signed as told."""

    def __init__(self, join_key: str | None, doc_key: str | None, tamper: bool) -> None:
        self.join_auth = Authenticator(join_key) if join_key else None
        self.doc_auth = Authenticator(doc_key) if doc_key else None
        self.tamper = tamper
        self.member: Member | None = None
        self.docs_served = 0
        self.port = free_port()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/join", self._join)
        app.router.add_get("/v1/cluster", self._cluster)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _join(self, request: web.Request) -> web.Response:
        self.member = wire.parse_join(await request.read()).member
        answer = wire.encode_join_answer(wire.JoinAnswer(SESSION, "fakeepoch", None, 2, 2))
        headers = self.join_auth.sign("200 /v1/join", answer) if self.join_auth else {}
        return web.Response(body=answer, content_type="application/json", headers=headers)

    async def _cluster(self, request: web.Request) -> web.Response:
        assert self.member is not None
        master = Member(0, "node0", ("127.0.0.1",), None)
        doc = ClusterDoc(SESSION, "fakeepoch.1", "node0", 29999, (master, self.member))
        payload = cluster.encode_cluster_doc(doc)
        headers = self.doc_auth.sign("200 /v1/cluster", payload) if self.doc_auth else {}
        if self.tamper:  # a genuine signature over a different document
            payload = payload.replace(b"29999", b"29998")
        self.docs_served += 1
        await asyncio.sleep(0.05)  # workers re-poll at once after a refusal
        return web.Response(body=payload, content_type="application/json", headers=headers)


@pytest.mark.parametrize(
    ("join_key", "doc_key", "tamper", "reason", "served"),
    [
        (None, None, False, "unsigned", False),
        (TOKEN, None, False, "unsigned", True),
        (TOKEN, "not-" + TOKEN, False, "bad_signature", True),
        (TOKEN, TOKEN, True, "bad_signature", True),
    ],
    ids=["join-answer-unsigned", "doc-unsigned", "doc-wrong-key", "doc-tampered"],
)
def test_worker_refuses_a_forged_master(
    loop_thread: LoopThread,
    logs: Records,
    join_key: str | None,
    doc_key: str | None,
    tamper: bool,
    reason: str,
    served: bool,
) -> None:
    fake = FakeMaster(join_key, doc_key, tamper)
    loop_thread.run(fake.start())
    node = loop_thread.run(
        start_node(["node0", "node1"], 1, token=TOKEN, peer_ports={"node0": fake.port})
    )
    try:
        wait_until(
            lambda: metric(node.local_port, "rallypoint_auth_failures_total", reason=reason) >= 1,
            f"the worker to count a {reason} answer",
        )
        if served:
            assert fake.docs_served >= 1
        status = json.loads(request(node.local_port, "GET", "/status").body)
        assert status["ready"] is False and status["generation"] is None
        assert request(node.local_port, "GET", "/env").status == 503
    finally:
        loop_thread.run(node.sidecar.stop())
        loop_thread.run(fake.stop())
    assert not logs.crashes()


def test_worker_keeps_saying_why_a_forged_document_is_refused(
    loop_thread: LoopThread, logs: Records
) -> None:
    fake = FakeMaster(TOKEN, "not-" + TOKEN, tamper=False)
    loop_thread.run(fake.start())
    node = loop_thread.run(
        start_node(["node0", "node1"], 1, token=TOKEN, peer_ports={"node0": fake.port})
    )
    try:
        wait_until(lambda: fake.docs_served >= 2, "the worker to poll the fake master twice")
        seen = []
        for _ in range(10):
            status = json.loads(request(node.local_port, "GET", "/status").body)
            seen.append([r["code"] for r in status["reasons"]])
            time.sleep(0.1)
        assert all("auth_failed" in codes for codes in seen), seen
    finally:
        loop_thread.run(node.sidecar.stop())
        loop_thread.run(fake.stop())


# -- mDNS announcements with bad signatures --------------------------------------------------


@pytest.fixture
def forged_announcement(loop_thread: LoopThread, multicast_lo: None) -> Iterator[Node]:
    """A sidecar with mDNS on loopback, and a rogue announcing node1 with the wrong key."""
    session_hosts = [f"m{uuid.uuid4().hex[:8]}", f"m{uuid.uuid4().hex[:8]}"]
    node = loop_thread.run(
        start_node(session_hosts, token=TOKEN, mdns=True, mdns_interfaces=("127.0.0.1",))
    )
    rogue = Mdns(
        session=node.sidecar.node.spec.session,
        host=session_hosts[1],
        peer_port=1,
        auth=Authenticator("not-" + TOKEN),
        interfaces=["127.0.0.1"],
    )
    loop_thread.run(rogue.start())
    loop_thread.run(rogue.announce(rank=1, generation="", addresses=["127.0.0.1"]))
    yield node
    loop_thread.run(rogue.close())
    loop_thread.run(node.sidecar.stop())


def mdns_status(node: Node) -> dict[str, object]:
    status = json.loads(request(node.local_port, "GET", "/status").body)
    mdns = status["mdns"]
    assert isinstance(mdns, dict)
    return mdns


def test_forged_mdns_announcement_is_rejected(forged_announcement: Node) -> None:
    node = forged_announcement

    def rejected() -> bool:
        rejections = mdns_status(node).get("rejections")
        return isinstance(rejections, dict) and rejections.get("signature", 0) >= 1

    wait_until(rejected, "the forged announcement to be rejected")
    # Its own announcement is published in the background; then it is the only peer.
    wait_until(lambda: mdns_status(node)["peers"] != 0, "the sidecar's own announcement")
    assert mdns_status(node)["peers"] == 1


def test_forged_mdns_announcement_is_counted_in_metrics(forged_announcement: Node) -> None:
    node = forged_announcement
    wait_until(
        lambda: metric(node.local_port, "rallypoint_mdns_rejected_total", reason="signature") >= 1,
        "rallypoint_mdns_rejected_total{reason=signature} to count the forged announcement",
    )
