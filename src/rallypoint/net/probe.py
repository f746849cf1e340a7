"""Connection probes: a challenge and answer over TCP that only a sidecar of the session can give.

The prober connects, sends ``RPPROBE/1 <nonce>`` (32 hex digits) and a newline, and expects
``RPPROBE/1 <rank> <host> <mac>``: the MAC (auth.probe_mac) covers the session, the nonce and
the answering node, keyed by the session token when one is set. "Connection refused" proves
nothing (an iptables REJECT answers the same way), and a port answered by anything else
(another process, a middlebox, the wrong node) fails the check with its own cause.

The listener side answers on *windows*: listening sockets opened on ports the sidecar already
holds (ports.HeldPort.listen), so that the master port, the TF port and an ephemeral-range
port can be probed without ever releasing them. The prober closes first, so TIME_WAIT lands
on the prober's ephemeral port, not on the held one.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import logging
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from rallypoint.auth import Authenticator
from rallypoint.core.links import LinkStat
from rallypoint.metrics import Metrics
from rallypoint.net import datapath, datawindow

log = logging.getLogger(__name__)

MAGIC = b"RPPROBE/1"
#: Longest line either side reads; anything longer is not a probe.
MAX_LINE = 256
#: A connection that sends no challenge within this is closed.
CHALLENGE_TIMEOUT_S = 2.0
#: After answering, how long the listener waits for the prober to close first.
LINGER_S = 1.0
#: Connections served at once per listener; more are closed at once (a flood of strangers).
MAX_CONNECTIONS = 256

_CHALLENGE = re.compile(rb"RPPROBE/1 ([0-9a-f]{32})\r?\n")
_ANSWER = re.compile(rb"RPPROBE/1 (\d{1,6}) ([A-Za-z0-9._:-]{1,253}) ([0-9a-f]{64})\r?\n")

#: (host name, address, port) -> where to connect; the identity outside tests.
ProbeRoute = Callable[[str, str, int], tuple[str, int]]


def direct(_host: str, address: str, port: int) -> tuple[str, int]:
    """The default route: connect to the address and port as they are."""
    return address, port


class Outcome(msgspec.Struct, frozen=True):
    """One probe's result. ``cause`` is stable: ok, timeout, refused, reset, no_route,
    foreign_answer (something that is not a sidecar of the session answered), wrong_peer
    (another node of the session answered), stalled (answered, then data stopped: see
    net/datapath.py), or error."""

    cause: str
    detail: str
    elapsed_s: float
    #: The data leg, when one was asked for and the answer checked out.
    transfer: datapath.Transfer | None = None
    #: A measured link's figures (prober.Prober: the best of its transfers).
    link: LinkStat | None = None

    @property
    def ok(self) -> bool:
        return self.cause == "ok"


async def probe(
    address: str,
    port: int,
    *,
    session: str,
    auth: Authenticator,
    rank: int,
    host: str,
    timeout_s: float,
    data: datapath.DataRequest | None = None,
) -> Outcome:
    """Connect to address:port within ``timeout_s`` and check the answer is rank ``rank``'s;
    then, with ``data``, move data both ways (datapath.exchange)."""
    # Raw non-blocking socket calls, not streams: a cluster makes N x (N-1) probes at once
    # and every node's CPU time per probe adds up on the critical path to ready.
    loop = asyncio.get_running_loop()
    started = time.monotonic()

    def done(cause: str, detail: str) -> Outcome:
        return Outcome(cause, detail, time.monotonic() - started)

    nonce = secrets.token_hex(16)
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address, port, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except (OSError, IndexError) as exc:
        return done("error", f"{address} is not a usable address: {exc}")
    try:
        sock.setblocking(False)
        mss = None if data is None else data.mss
        failed = await _connect(loop, sock, sockaddr, mss=mss, timeout_s=timeout_s, done=done)
        if failed is not None:
            return failed
        try:
            # The handshake completed, so a firewall DROP or REJECT is ruled out: whatever
            # listens here must answer like a sidecar of the session.
            async with asyncio.timeout(timeout_s):
                line = await _challenge(loop, sock, nonce)
        except TimeoutError:
            return done("foreign_answer", f"connected, but no probe answer within {timeout_s:g} s")
        except OSError as exc:
            return done("foreign_answer", f"connected, then {_describe(exc)} before any answer")
        judged = _judge(line, nonce, session=session, auth=auth, rank=rank, host=host, done=done)
        if not judged.ok or data is None:
            return judged
        transfer = await datapath.exchange(
            sock, data, auth.data_mac(session, nonce, data.up, data.down)
        )
    finally:
        sock.close()
    return _with_transfer(transfer, time.monotonic() - started)


async def _connect(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    sockaddr: tuple[Any, ...],
    *,
    mss: int | None,
    timeout_s: float,
    done: Callable[[str, str], Outcome],
) -> Outcome | None:
    """Clamp the MSS when asked, then connect within ``timeout_s``: None once connected,
    else the outcome of the failure."""
    if mss is not None:
        try:
            datapath.clamp_mss(sock, mss)
        except OSError as exc:
            return done("error", f"cannot clamp the MSS to {mss}: {_describe(exc)}")
    try:
        async with asyncio.timeout(timeout_s):
            await loop.sock_connect(sock, sockaddr)
    except TimeoutError:
        return done("timeout", f"timed out after {timeout_s:g} s")
    except OSError as exc:
        return _refused(exc, done)
    return None


async def _challenge(loop: asyncio.AbstractEventLoop, sock: socket.socket, nonce: str) -> bytes:
    """Send the challenge; the answer line, or what came before the port closed or ran long."""
    await loop.sock_sendall(sock, MAGIC + b" " + nonce.encode() + b"\n")
    line = b""
    while not line.endswith(b"\n") and len(line) <= MAX_LINE:
        chunk = await loop.sock_recv(sock, MAX_LINE + 1)
        if not chunk:
            break
        line += chunk
    return line


def _with_transfer(transfer: datapath.Transfer, elapsed_s: float) -> Outcome:
    """The outcome of a checked answer whose data leg ran."""
    # A window that answers and then breaks the data protocol is not a sidecar we trust.
    cause = transfer.cause if transfer.cause in ("ok", "stalled") else "foreign_answer"
    detail = "answered" if transfer.ok else f"answered, then {transfer.detail}"
    return Outcome(cause, detail, elapsed_s, transfer)


def _judge(
    line: bytes,
    nonce: str,
    *,
    session: str,
    auth: Authenticator,
    rank: int,
    host: str,
    done: Callable[[str, str], Outcome],
) -> Outcome:
    """The outcome of a probe that got ``line`` back."""
    if len(line) > MAX_LINE:
        return done("foreign_answer", "the answer was not a probe answer (too long)")
    match = _ANSWER.fullmatch(line)
    if match is None:
        if not line:
            return done("foreign_answer", "the port closed the connection without answering")
        return done("foreign_answer", f"the port answered {line[:40]!r}, not a probe answer")
    got_rank, got_host = int(match.group(1)), match.group(2).decode()
    expected = auth.probe_mac(session, nonce, got_rank, got_host)
    if not hmac.compare_digest(expected, match.group(3).decode()):
        return done(
            "foreign_answer",
            "the answer's signature does not match this session"
            + (" and token" if auth.enabled else ""),
        )
    if got_rank != rank or got_host.lower() != host.lower():
        return done("wrong_peer", f"{got_host} (rank {got_rank}) answered instead")
    return done("ok", "answered")


def _refused(exc: OSError, done: Callable[[str, str], Outcome]) -> Outcome:
    """The outcome of a connect that failed before the handshake completed."""
    if isinstance(exc, ConnectionRefusedError):
        return done("refused", "connection refused")
    if isinstance(exc, ConnectionResetError):
        return done("reset", "connection reset")
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return done("no_route", exc.strerror or "no route to host")
    return done("error", _describe(exc))


def _describe(exc: OSError) -> str:
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, BrokenPipeError):
        return "connection closed"
    return exc.strerror or type(exc).__name__


class ProbeListener:
    """Answers probes on the listening sockets it is given, as one node of one session."""

    def __init__(
        self, *, session: str, rank: int, host: str, auth: Authenticator, metrics: Metrics
    ) -> None:
        self.session = session
        self.rank = rank
        self.host = host
        self.auth = auth
        self.metrics = metrics
        #: Connections being served now (at most MAX_CONNECTIONS).
        self.active = 0
        self._servers: list[asyncio.Server] = []

    async def serve(self, sockets: Iterable[socket.socket]) -> None:
        """Answer probes on each listening socket until close()."""
        loop = asyncio.get_running_loop()
        for sock in sockets:
            server = await loop.create_server(lambda: _Answer(self), sock=sock)
            self._servers.append(server)

    async def close(self) -> None:
        """Stop answering and close the sockets; closing twice is safe.

        Connections already accepted finish on their own within LINGER_S or
        CHALLENGE_TIMEOUT_S; nothing waits for them.
        """
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    def answer(self, nonce: str) -> bytes:
        mac = self.auth.probe_mac(self.session, nonce, self.rank, self.host)
        return b"%s %d %s %s\n" % (MAGIC, self.rank, self.host.encode(), mac.encode())

    def count(self, result: str) -> None:
        self.metrics.probes_answered.labels(result).inc()

    def count_bytes(self, direction: str, count: int) -> None:
        self.metrics.probe_bytes.labels(direction).inc(count)


class _Answer(asyncio.Protocol):
    """One connection to a window: read the challenge line, answer it, let the prober close."""

    def __init__(self, listener: ProbeListener) -> None:
        self.listener = listener
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.answered = False
        self.counted = False
        self.slot = False
        self.timer: asyncio.TimerHandle | None = None
        self.nonce = ""
        self.data: datawindow.WindowData | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self.listener.active >= MAX_CONNECTIONS:
            # A flood of strangers: refuse at once rather than hold more state.
            self._count("refused_busy")
            transport.abort()
            return
        self.listener.active += 1
        self.slot = True
        self.timer = asyncio.get_running_loop().call_later(
            CHALLENGE_TIMEOUT_S, self._give_up, "silent"
        )

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        if self.answered:
            self._data(data)
            return
        self.buffer += data
        if b"\n" not in self.buffer:
            if len(self.buffer) > MAX_LINE:
                self._give_up("garbage")
            return
        line = self.buffer.partition(b"\n")[0] + b"\n"
        match = _CHALLENGE.fullmatch(line)
        if match is None:
            self._give_up("garbage")
            return
        self.answered = True
        self.nonce = match.group(1).decode()
        self.transport.write(self.listener.answer(self.nonce))
        self._count("answered")
        self._linger()
        rest = self.buffer.partition(b"\n")[2]
        self.buffer = b""
        if rest:
            self._data(rest)

    def _linger(self) -> None:
        """Let the prober close first: TIME_WAIT then stays on its side, off the held port."""
        if self.timer is not None:
            self.timer.cancel()
        if self.transport is not None:
            self.timer = asyncio.get_running_loop().call_later(LINGER_S, self.transport.close)

    def _data(self, data: bytes) -> None:
        """Bytes after the answer: the data leg (datawindow.WindowData), or garbage."""
        assert self.transport is not None
        if self.data is None:
            listener = self.listener
            self.data = datawindow.WindowData(
                self.transport,
                lambda up, down, mac: hmac.compare_digest(
                    listener.auth.data_mac(listener.session, self.nonce, up, down), mac
                ),
                listener.count_bytes,
            )
            if self.timer is not None:
                self.timer.cancel()
            self.timer = asyncio.get_running_loop().call_later(
                datawindow.SERVE_MAX_S, self._give_up, "timeout"
            )
        if self.data.state == "done":
            return  # the prober closes next
        problem = self.data.feed(data)
        if problem is not None:
            self._give_up(problem)
        elif self.data.state == "done":
            self._linger()

    def pause_writing(self) -> None:
        if self.data is not None:
            self.data.pause()

    def resume_writing(self) -> None:
        if self.data is not None:
            self.data.resume()

    def eof_received(self) -> bool:
        self._count("broken" if self.buffer else "silent")
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.slot:
            self.slot = False
            self.listener.active -= 1
        self._count("broken")

    def _give_up(self, result: str) -> None:
        self._count(result)
        if self.transport is not None:
            self.transport.close()

    def _count(self, result: str) -> None:
        """Count this connection once, under its first result."""
        if not self.counted:
            self.counted = True
            self.listener.count(result)
