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
from dataclasses import dataclass

from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics

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


@dataclass(frozen=True, slots=True)
class Outcome:
    """One probe's result. ``cause`` is stable: ok, timeout, refused, reset, no_route,
    foreign_answer (something that is not a sidecar of the session answered), wrong_peer
    (another node of the session answered) or error."""

    cause: str
    detail: str
    elapsed_s: float

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
) -> Outcome:
    """Connect to address:port within ``timeout_s`` and check the answer is rank ``rank``'s."""
    started = time.monotonic()

    def done(cause: str, detail: str) -> Outcome:
        return Outcome(cause, detail, time.monotonic() - started)

    nonce = secrets.token_hex(16)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(address, port, limit=MAX_LINE)
    except TimeoutError:
        return done("timeout", f"timed out after {timeout_s:g} s")
    except OSError as exc:
        return _refused(exc, done)
    try:
        # The handshake completed, so a firewall DROP or REJECT is ruled out: whatever
        # listens here must answer like a sidecar of the session.
        async with asyncio.timeout(timeout_s):
            writer.write(MAGIC + b" " + nonce.encode() + b"\n")
            await writer.drain()
            line = await reader.readline()
    except TimeoutError:
        return done("foreign_answer", f"connected, but no probe answer within {timeout_s:g} s")
    except (asyncio.LimitOverrunError, ValueError):
        return done("foreign_answer", "the answer was not a probe answer (too long)")
    except OSError as exc:
        return done("foreign_answer", f"connected, then {_describe(exc)} before any answer")
    finally:
        writer.close()
    match = _ANSWER.fullmatch(line[:MAX_LINE])
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
        self._slots = asyncio.Semaphore(MAX_CONNECTIONS)
        self._servers: list[asyncio.Server] = []

    async def serve(self, sockets: Iterable[socket.socket]) -> None:
        """Answer probes on each listening socket until close()."""
        for sock in sockets:
            server = await asyncio.start_server(self._handle, sock=sock, limit=MAX_LINE)
            self._servers.append(server)

    async def close(self) -> None:
        """Stop answering and close the sockets; closing twice is safe."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for server in servers:
            # Handlers in flight end within LINGER_S; do not wait on them beyond that.
            try:
                async with asyncio.timeout(LINGER_S + CHALLENGE_TIMEOUT_S):
                    await server.wait_closed()
            except TimeoutError:
                log.debug("probe_listener_close_timeout")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._slots.locked():
            self.metrics.probes_answered.labels("refused_busy").inc()
            writer.close()
            return
        async with self._slots:
            try:
                await self._answer(reader, writer)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
                self.metrics.probes_answered.labels("broken").inc()
            finally:
                writer.close()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CHALLENGE_TIMEOUT_S):
                line = await reader.readline()
        except TimeoutError:
            self.metrics.probes_answered.labels("silent").inc()
            return
        match = _CHALLENGE.fullmatch(line)
        if match is None:
            self.metrics.probes_answered.labels("garbage").inc()
            return
        nonce = match.group(1).decode()
        mac = self.auth.probe_mac(self.session, nonce, self.rank, self.host)
        writer.write(b"%s %d %s %s\n" % (MAGIC, self.rank, self.host.encode(), mac.encode()))
        await writer.drain()
        self.metrics.probes_answered.labels("answered").inc()
        # Let the prober close first: TIME_WAIT then stays on its side, off the held port.
        try:
            async with asyncio.timeout(LINGER_S):
                await reader.read(MAX_LINE)
        except TimeoutError:
            pass
