"""Overload: slowloris connections, thousands of concurrent joins, a resolver that hangs."""

from __future__ import annotations

import contextlib
import json
import resource
import socket
import time
from collections.abc import Iterator

import pytest

from rallypoint import server, wire
from rallypoint.model import Member
from tests.fakes import FakeResolver
from tests.hardening.harness import (
    SESSION,
    LoopThread,
    Node,
    Records,
    herd,
    readable,
    request,
    start_node,
)

SLOW_CLIENTS = 1000
JOINERS = 2000
#: Half-sent requests must be closed by then: aiohttp's keep-alive timer, which (since
#: 3.14) also runs from connection_made until a complete request arrives, plus slack.
CLOSE_BOUND_S = server.KEEPALIVE_S + 3.0


@pytest.fixture(scope="module", autouse=True)
def enough_file_descriptors() -> Iterator[None]:
    """Room for both ends of a few thousand loopback connections in this one process."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 16384) if hard != resource.RLIM_INFINITY else 16384
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 4 * JOINERS + 512
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_slowloris_does_not_stop_probes_and_is_closed_in_time(
    ready_node: Node, logs: Records
) -> None:
    port = ready_node.local_port
    socks: list[socket.socket] = []
    try:
        for i in range(SLOW_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", port), 10)
            # Headers never finished; every tenth client trickles a byte now and then.
            sock.sendall(b"GET /env?wait=300 HTTP/1.1\r\nHost: x\r\nX-Slow-%d: " % i)
            socks.append(sock)
        opened = time.monotonic()
        for path, expected in (("/livez", {200}), ("/readyz", {200}), ("/env", {200})):
            reply = request(port, "GET", path, timeout_s=5.0)
            assert reply.status in expected, f"{path} answered {reply.status} under slowloris"
        trickling = socks[::10]
        while time.monotonic() - opened < CLOSE_BOUND_S:
            for sock in trickling:
                # Already closed by the server is what we want.
                with contextlib.suppress(OSError):
                    sock.send(b"a")
            time.sleep(1.0)
        ready = readable(socks, 0.5)
        closed = 0
        for sock in ready:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            # Closed outright, or told 4xx (a request line too long ...) and closed.
            if not data or data.startswith(b"HTTP/1.1 4"):
                closed += 1
        remaining = SLOW_CLIENTS - closed
        assert remaining == 0, (
            f"{remaining} of {SLOW_CLIENTS} half-sent connections still open "
            f"{CLOSE_BOUND_S:g}s after they were opened"
        )
        reply = request(port, "GET", "/livez", timeout_s=5.0)
        assert reply.status == 200
    finally:
        for sock in socks:
            sock.close()
    assert not logs.crashes()


ABANDONED = 20
#: Time for the server to see the disconnects and cancel the handlers; not a speed claim.
ABANDON_BOUND_S = 5.0


def env_waiters(node: Node) -> int:
    waiters = json.loads(request(node.local_port, "GET", "/status").body)["env_waiters"]
    assert isinstance(waiters, int)
    return waiters


def wait_for_waiters(node: Node, expected: int, bound_s: float) -> int:
    """Poll /status until env_waiters is ``expected`` or ``bound_s`` passed; the last count."""
    deadline = time.monotonic() + bound_s
    while (count := env_waiters(node)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def test_abandoned_env_long_polls_stop_waiting(waiting_master: Node, logs: Records) -> None:
    """A client that leaves a GET /env?wait=300 frees its handler, not 300 s later."""
    assert env_waiters(waiting_master) == 0
    socks = [
        socket.create_connection(("127.0.0.1", waiting_master.local_port), 10)
        for _ in range(ABANDONED)
    ]
    try:
        for sock in socks:
            sock.sendall(b"GET /env?wait=300 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert wait_for_waiters(waiting_master, ABANDONED, ABANDON_BOUND_S) == ABANDONED
    finally:
        for sock in socks:
            sock.close()
    left = wait_for_waiters(waiting_master, 0, ABANDON_BOUND_S)
    assert left == 0, f"{left} of {ABANDONED} abandoned /env?wait handlers still waiting"
    assert not logs.crashes()


def worker_address(rank: int) -> str:
    # RFC 2544 benchmarking range: never routed, and never contacted (endpoint -> loopback).
    return f"198.18.{rank // 250}.{rank % 250 + 1}"


def test_two_thousand_concurrent_joins_are_all_served(
    loop_thread: LoopThread, logs: Records
) -> None:
    hosts = [f"node{r}" for r in range(JOINERS + 1)]
    table: dict[str, list[str]] = {h: [worker_address(r)] for r, h in enumerate(hosts)}
    table["node0"] = ["127.0.0.1"]
    node = loop_thread.run(
        start_node(
            hosts,
            resolver=FakeResolver(table),
            peer_ports={h: 9 for h in hosts[1:]},  # pokes to workers: refused at once
            loopback_ok=False,
            # The master's own name is 127.0.0.1 here (it really listens there); the 2,000
            # worker names still go through verification against their 198.18.x addresses.
            allow_loopback=True,
            long_poll_s=5.0,
            deadline_s=120.0,
            # The herd runs no probe windows: the master tries no connections to it.
            probe=False,
        )
    )
    try:
        bodies = [
            wire.encode_join(
                wire.JoinRequest(SESSION, Member(r, hosts[r], (worker_address(r),), 2222))
            )
            for r in range(1, JOINERS + 1)
        ]
        results = herd(node.peer_port, "/v1/join", bodies, timeout_s=90.0)
        statuses = [reply.status for reply in results]
        assert statuses.count(200) == JOINERS, {s: statuses.count(s) for s in set(statuses)}
        answers = [wire.parse_join_answer(reply.body) for reply in results]
        assert max(a.joined for a in answers) == JOINERS + 1
        generation = next(a.generation for a in answers if a.joined == JOINERS + 1)
        assert generation is not None
        # Then the herd reports its checks at once: the verdict waits for every node.
        reports = [
            wire.encode_report(wire.Report(SESSION, generation, r, hosts[r], passed=True))
            for r in range(1, JOINERS + 1)
        ]
        statuses = [
            reply.status for reply in herd(node.peer_port, "/v1/report", reports, timeout_s=90.0)
        ]
        assert statuses.count(200) == JOINERS, {s: statuses.count(s) for s in set(statuses)}
        sidecar = node.sidecar
        readiness = sidecar.node.readiness
        assert loop_thread.run(readiness.wait_ready(60), 90), readiness.reasons()
        doc = sidecar.node.verification.doc
        assert doc is not None and len(doc.members) == JOINERS + 1
        reply = request(node.local_port, "GET", "/env")
        assert json.loads(reply.body)["NNODES"] == str(JOINERS + 1)
    finally:
        loop_thread.run(node.sidecar.stop())
    assert not logs.crashes()


def test_hanging_resolver_does_not_stall_the_api(loop_thread: LoopThread, logs: Records) -> None:
    resolver = FakeResolver({"node0": ["127.0.0.1"]})
    resolver.set("node1", ["127.0.0.1"], hang=True)
    resolver.set("node2", ["127.0.0.1"], hang=True)
    node = loop_thread.run(
        start_node(["node0", "node1", "node2"], resolver=resolver, resolve_timeout_s=30.0)
    )
    try:
        for rank in (1, 2):
            body = wire.encode_join(
                wire.JoinRequest(SESSION, Member(rank, f"node{rank}", ("127.0.0.1",), None))
            )
            assert request(node.peer_port, "POST", "/v1/join", body=body).status == 200
        deadline = time.monotonic() + 10
        while resolver.calls["node1"] == 0 or resolver.calls["node2"] == 0:
            assert time.monotonic() < deadline, "verification never looked the names up"
            time.sleep(0.05)
        # Both lookups now hang (for up to resolve_timeout_s): the API must still answer.
        for path, status in (("/livez", 200), ("/readyz", 503), ("/status", 200), ("/env", 503)):
            reply = request(node.local_port, "GET", path, timeout_s=5.0)
            assert reply.status == status, f"{path}: {reply.status} {reply.body[:200]!r}"
        reply = request(node.peer_port, "GET", "/v1/ready", timeout_s=5.0)
        assert json.loads(reply.body) == {"ready": False}
        status = json.loads(request(node.local_port, "GET", "/status").body)
        assert [r["code"] for r in status["reasons"]] == ["verifying"]
    finally:
        loop_thread.run(node.sidecar.stop(), 30)
    assert not logs.crashes()
