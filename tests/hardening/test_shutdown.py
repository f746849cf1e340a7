"""Shutdown of a real `rallypoint serve` process: SIGTERM mid long-poll, SIGKILL and restart."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rallypoint.auth import Authenticator
from rallypoint.mdns.announce import Mdns
from tests.conftest import require
from tests.hardening.harness import LoopThread, Reply, free_port, request

EXIT_BOUND_S = 5.0
START_BOUND_S = 20.0


def loopback_multicast_works() -> bool:
    from tests.inprocess.test_mdns import loopback_multicast_works as works

    return works()


@dataclass
class Serve:
    """`rallypoint serve` as the only node of a 2-node session whose peer never comes."""

    tmp: Path
    mdns: bool = False
    name: str = field(default_factory=lambda: f"rp{uuid.uuid4().hex[:8]}")
    local_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    master_port: int = field(default_factory=free_port)
    tf_port: int = field(default_factory=free_port)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RALLYPOINT_")}
        env.update(
            RALLYPOINT_HOSTS=f"{self.name},{self.name}-ghost",
            RALLYPOINT_NODE_RANK="0",
            RALLYPOINT_SESSION=self.name,
            RALLYPOINT_LOCAL_HOSTS="127.0.0.1",
            RALLYPOINT_LOCAL_PORT=str(self.local_port),
            RALLYPOINT_PEER_HOST="127.0.0.1",
            RALLYPOINT_PEER_PORT=str(self.peer_port),
            MASTER_PORT=str(self.master_port),
            RALLYPOINT_TF_PORT=str(self.tf_port),
            RALLYPOINT_MDNS="1" if self.mdns else "0",
            RALLYPOINT_MDNS_INTERFACES="127.0.0.1",
            RALLYPOINT_RESOLVE_TIMEOUT="1",
            RALLYPOINT_BACKOFF_MAX="0.5",
        )
        return env

    def start(self) -> subprocess.Popen[bytes]:
        exe = shutil.which("rallypoint")
        cmd = [exe, "serve"] if exe else [sys.executable, "-m", "rallypoint", "serve"]
        log = (self.tmp / f"serve-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(cmd, env=self.environ(), stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        deadline = time.monotonic() + START_BOUND_S
        while True:
            assert proc.poll() is None, f"serve exited {proc.returncode}: {self.log(-1)}"
            try:
                if request(self.local_port, "GET", "/livez", timeout_s=1.0).status == 200:
                    return proc
            except OSError:
                pass
            assert time.monotonic() < deadline, f"serve did not listen: {self.log(-1)}"
            time.sleep(0.1)

    def log(self, index: int) -> str:
        return (self.tmp / f"serve-{index % len(self.procs)}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


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
