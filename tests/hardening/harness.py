"""Plumbing for the hardening tests: sidecars on a background event loop, raw HTTP clients.

The sidecars run in one event loop on a daemon thread so that synchronous clients (raw
sockets, http.client, schemathesis' requests) can talk to them like any outside process
would, each request with its own timeout. Every answer is then judged by `assert_clean`.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import re
import select
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp.http_exceptions import HttpProcessingError
from hypothesis import HealthCheck, settings

from rallypoint.model import ClusterSpec
from rallypoint.settings import Settings
from rallypoint.sidecar import Sidecar
from tests.conftest import IN_CI
from tests.fakes import FakeResolver
from tests.support.ports import free_port
from tests.support.settings import fast_settings

T = TypeVar("T")

SESSION = "sess-hardening"
#: Every request a test sends gets this long to be answered; a longer wait is a stuck handler.
REQUEST_TIMEOUT_S = 10.0

# Hypothesis profiles: CI runs the full budget (about 7,000 generated cases across the fuzz
# tests of this directory), a local run a small sample. Tests take a share with `fuzz(share)`.
for _name, _examples in (("hardening-ci", 1000), ("hardening-local", 100)):
    settings.register_profile(
        _name,
        max_examples=_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        print_blob=True,
    )
PROFILE = settings.get_profile(
    os.environ.get("RALLYPOINT_HARDENING_PROFILE", "hardening-ci" if IN_CI else "hardening-local")
)


def fuzz(share: float = 1.0) -> settings:
    """The selected profile with ``share`` of its max_examples (at least 10)."""
    return settings(PROFILE, max_examples=max(10, int(PROFILE.max_examples * share)))


class LoopThread:
    """An asyncio event loop on a daemon thread; `run` executes a coroutine there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        """The coroutine's result; TimeoutError (a stuck loop) after ``timeout_s``."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def call(self, func: Callable[[], T], timeout_s: float = 10.0) -> T:
        """Run a plain callable on the loop thread (to read sidecar state safely)."""

        async def wrapper() -> T:
            return func()

        return self.run(wrapper(), timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def base_settings(**changes: Any) -> Settings:
    """The fast settings with a minute's deadline and a half-second long poll."""
    return fast_settings(**{"deadline_s": 60.0, "long_poll_s": 0.5, **changes})


@dataclass
class Node:
    """One in-process sidecar and the ports it listens on."""

    sidecar: Sidecar
    local_port: int
    peer_port: int
    resolver: FakeResolver
    hosts: tuple[str, ...] = field(default=())


async def start_node(
    hosts: Sequence[str],
    rank: int = 0,
    *,
    environ: Mapping[str, str] | None = None,
    resolver: FakeResolver | None = None,
    peer_ports: dict[str, int] | None = None,
    loopback_ok: bool = True,
    **changes: Any,
) -> Node:
    """Start one sidecar of ``hosts`` as ``rank``; peers are reached at 127.0.0.1."""
    hosts = tuple(hosts)
    ports = peer_ports if peer_ports is not None else {}
    for host in hosts:
        if host not in ports:  # not setdefault: it would take a port for every given host
            ports[host] = free_port()
    local_port = free_port()
    if resolver is None:
        resolver = FakeResolver({host: ["127.0.0.1"] for host in hosts})
    settings_ = base_settings(local_port=local_port, peer_port=ports[hosts[rank]], **changes)
    spec = ClusterSpec("explicit", hosts, rank, len(hosts), SESSION, loopback_ok=loopback_ok)
    sidecar = Sidecar(
        settings_,
        dict(environ or {}),
        resolver=resolver,
        spec=spec,
        addresses=["127.0.0.1"],
        endpoint=lambda host, _address: ("127.0.0.1", ports.get(host, 9)),
    )
    await sidecar.start()
    return Node(sidecar, local_port, ports[hosts[rank]], resolver, hosts)


# -- clients --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip()


def request(
    port: int,
    method: str,
    target: str,
    *,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> Reply:
    """One HTTP/1.1 request on a fresh connection; socket.timeout if not answered in time."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, target, body=body, headers=dict(headers or {}))
        resp = conn.getresponse()
        data = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def herd(port: int, path: str, bodies: Sequence[bytes], *, timeout_s: float) -> list[Reply]:
    """POST every body at once on its own connection, as that many nodes would, in order.

    Each request is sent whole the moment its connection opens, as a node's sidecar sends
    it, and every connection is open before any answer is read. An asyncio client in this
    process would not model that: it shares the GIL with the sidecar's loop thread, so under
    load it wrote some requests seconds after their connections were accepted, past the
    peer API's first-request bound (the slowloris defence, server.peer_keepalive_s).
    """
    socks: list[socket.socket] = []
    try:
        for body in bodies:
            sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
            socks.append(sock)
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
        replies = []
        for sock in socks:
            resp = http.client.HTTPResponse(sock)
            resp.begin()
            data = resp.read()
            replies.append(Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data))
        return replies
    finally:
        for sock in socks:
            sock.close()


def readable(socks: Sequence[socket.socket], timeout_s: float) -> list[socket.socket]:
    """The sockets with data or EOF waiting (poll-based: any fd number)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [by_fd[fd] for fd, _ in poller.poll(timeout_s * 1000)]


_STATUS_LINE = re.compile(rb"HTTP/1\.[01] (\d{3})")


def raw_exchange(port: int, data: bytes, *, timeout_s: float = REQUEST_TIMEOUT_S) -> Reply:
    """Send raw bytes, read until the server closes; the parsed answer (status 0: none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    match = _STATUS_LINE.match(raw)
    if match is None:
        return Reply(0, {}, raw)
    head, _, body = raw.partition(b"\r\n\r\n")
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return Reply(int(match.group(1)), headers, body)


_TRACEBACK_MARKERS = (b"Traceback", b'File "', b"site-packages", b"rallypoint/")


def assert_clean(reply: Reply, allowed: Sequence[int], what: str) -> None:
    """A documented status, never a 5xx other than 503, never a traceback in the answer."""
    assert reply.status in allowed, f"{what}: status {reply.status} not in {sorted(allowed)}"
    blob = reply.body + repr(reply.headers).encode()
    for marker in _TRACEBACK_MARKERS:
        assert marker not in blob, f"{what}: {marker!r} leaked into the answer: {blob[:300]!r}"


# -- logs -----------------------------------------------------------------------------------


class Records(logging.Handler):
    """Every log record emitted while installed (all loggers, all levels)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._lock_records:
            self.records.append(record)

    def clear(self) -> None:
        with self._lock_records:
            self.records.clear()

    def lines(self) -> list[str]:
        """Each record formatted with its traceback, as a log file would hold it."""
        formatter = logging.Formatter("%(levelname)s %(name)s %(message)s")
        with self._lock_records:
            return [formatter.format(r) for r in self.records]

    def crashes(self) -> list[str]:
        """Records at ERROR or above, or carrying a traceback: unhandled errors.

        aiohttp's own report of a request its HTTP parser refused (a 400 before any handler
        runs) is left out here; test_protocol_errors_do_not_log_tracebacks covers it.
        """
        with self._lock_records:
            bad = [
                r
                for r in self.records
                if (r.levelno >= logging.ERROR or r.exc_info) and not is_parser_error(r)
            ]
        return [f"{r.name}: {r.getMessage()}" for r in bad]

    def parser_errors(self) -> list[str]:
        """aiohttp's ERROR records (with traceback) for requests its parser refused."""
        with self._lock_records:
            return [r.getMessage() for r in self.records if is_parser_error(r)]


def is_parser_error(record: logging.LogRecord) -> bool:
    """aiohttp.server's "Error handling request" record for an HttpProcessingError."""
    exc = record.exc_info[1] if record.exc_info else None
    return record.name == "aiohttp.server" and isinstance(exc, HttpProcessingError)


@contextmanager
def recording() -> Iterator[Records]:
    """Install a Records handler on the root logger at DEBUG for the duration."""
    root = logging.getLogger()
    handler = Records()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
