"""Shutdown of a real `rallypoint serve` process: SIGTERM mid long-poll, SIGKILL and restart."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.auth import Authenticator
from rallypoint.mdns.announce import Mdns
from tests.conftest import require
from tests.hardening.harness import LoopThread, Reply, request
from tests.hardening.serve import EXIT_BOUND_S, START_BOUND_S, Serve
from tests.support.mdns import loopback_multicast_works


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    s = Serve(tmp_path)
    yield s
    s.stop_all()


@pytest.fixture
def serve_mdns(tmp_path: Path) -> Iterator[Serve]:
    require(loopback_multicast_works(), "multicast over loopback (127.0.0.1) is not available")
    s = Serve(tmp_path, mdns=True)
    yield s
    s.stop_all()


def poll_readyz(port: int, seen: list[str], stop: threading.Event) -> None:
    """Record every /readyz answer (or "gone") until the listener disappears."""
    while not stop.is_set():
        try:
            reply = request(port, "GET", "/readyz", timeout_s=2.0)
        except OSError:
            seen.append("gone")
            return
        seen.append(f"{reply.status} {reply.body.decode().strip()}")
        time.sleep(0.02)


def test_sigterm_readiness_goodbye_and_exit(serve_mdns: Serve) -> None:
    """SIGTERM with a long-poll open: 503 shutting_down first, mDNS goodbye, exit 0 in 5 s."""
    proc = serve_mdns.start()
    loop = LoopThread()
    observer = Mdns(
        session=serve_mdns.name,
        host="observer",
        peer_port=1,
        auth=Authenticator(None),
        interfaces=["127.0.0.1"],
    )
    try:
        loop.run(observer.start())

        def announced() -> bool:
            return serve_mdns.name in {a.host for a in loop.call(observer.peers)}

        deadline = time.monotonic() + START_BOUND_S
        while not announced():
            assert time.monotonic() < deadline, "the sidecar's mDNS announcement never arrived"
            time.sleep(0.1)

        readyz: list[str] = []
        stop = threading.Event()
        poller = threading.Thread(target=poll_readyz, args=(serve_mdns.local_port, readyz, stop))
        long_poll: list[Reply | BaseException] = []

        def wait_env() -> None:
            try:
                long_poll.append(
                    request(serve_mdns.local_port, "GET", "/env?wait=60", timeout_s=30.0)
                )
            except OSError as exc:
                long_poll.append(exc)

        waiter = threading.Thread(target=wait_env)
        poller.start()
        waiter.start()
        time.sleep(0.5)
        assert readyz and readyz[-1].startswith("503 not ready: waiting_for_join")
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(EXIT_BOUND_S + 5)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - sent
        stop.set()
        poller.join(10)
        waiter.join(35)
        assert code == 0, f"exit code {code} after SIGTERM: {serve_mdns.log(-1)}"
        assert took <= EXIT_BOUND_S, f"exit took {took:.1f}s"
        shutting = [s for s in readyz if "shutting_down" in s]
        assert shutting, f"/readyz never said shutting_down before the listener went: {readyz}"
        assert all(s.startswith("503 ") for s in shutting)
        # The goodbye (TTL 0) removes the record at once, long before its 120 s TTL runs out.
        deadline = time.monotonic() + 3.0
        while announced():
            assert time.monotonic() < deadline, "no mDNS goodbye: the announcement lingers"
            time.sleep(0.05)
        assert "Traceback" not in serve_mdns.log(-1)
        assert len(long_poll) == 1  # answered or dropped, never left hanging
    finally:
        loop.run(observer.close())
        loop.close()


def test_sigterm_answers_the_long_poll_in_flight(serve: Serve) -> None:
    """The long-poll in flight gets the verdict (503 shutting_down), not a dropped connection."""
    proc = serve.start()
    answers: list[Reply | BaseException] = []

    def wait_env() -> None:
        try:
            answers.append(request(serve.local_port, "GET", "/env?wait=60", timeout_s=30.0))
        except OSError as exc:
            answers.append(exc)

    waiter = threading.Thread(target=wait_env)
    waiter.start()
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(EXIT_BOUND_S + 5) == 0
    waiter.join(35)
    (answer,) = answers
    assert isinstance(answer, Reply), f"/env?wait=60 got no answer at SIGTERM: {answer!r}"
    assert answer.status == 503
    codes = [r["code"] for r in json.loads(answer.body)["reasons"]]
    assert codes == ["shutting_down"]


def test_sigkill_then_immediate_restart_on_the_same_ports(serve: Serve) -> None:
    first = serve.start()
    status = json.loads(request(serve.local_port, "GET", "/status").body)
    assert status["ports"]["master"]["port"] == serve.master_port
    tf_port = status["ports"]["tf"]["port"]
    # Connections in every state a killed process can leave behind: an idle keep-alive
    # client of the local API and a peer long-polling GET /v1/cluster.
    idle = request(serve.local_port, "GET", "/livez")
    assert idle.status == 200
    holder = threading.Thread(target=_long_poll_cluster, args=(serve.peer_port,))
    holder.start()
    time.sleep(0.3)
    first.kill()
    first.wait(10)
    second = serve.start()
    status = json.loads(request(serve.local_port, "GET", "/status").body)
    assert status["ports"]["master"]["port"] == serve.master_port
    assert status["ports"]["tf"]["port"] == tf_port
    assert request(serve.peer_port, "GET", "/v1/ready").status == 200
    second.send_signal(signal.SIGTERM)
    assert second.wait(EXIT_BOUND_S + 5) == 0
    holder.join(15)


def _long_poll_cluster(port: int) -> None:
    # The process is killed under it: a dropped connection is the expected end.
    with contextlib.suppress(OSError):
        request(port, "GET", "/v1/cluster")
