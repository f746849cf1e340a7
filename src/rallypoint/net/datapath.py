"""The data leg of a probe: bytes both ways after the challenge, timed, and counted by the kernel.

A handshake and a one-line answer cross any path; training then moves megabytes. After a
probe's answer checks out, the prober asks the window to move data (docs/readiness.md,
"Data path"):

    prober -> RPDATA/1 <up> <down> <mac>\\n, then <up> bytes
    window -> RPACK/1\\n once all <up> bytes arrived, then <down> bytes
    prober -> RPSTAT/1\\n
    window -> RPSTAT/1 <bytes sent> <retransmitted> <leg us>\\n
              (its TCP_INFO counters of the down leg, and how long the leg took)

Each leg is timed by its sender, the same way: from its first byte written to the word that
the last one arrived (the ACK line for the up leg, RPSTAT/1 for the down leg). A receiver
that is slow to read makes a leg look slower, never faster. (The kernel's own busy-time
counters tick in jiffies, too coarse for a leg of a few milliseconds.)

The MAC (auth.data_mac) binds the sizes to the probe's nonce and, with a token, to the
secret. Both sizes are capped (MAX_DATA_BYTES). Progress is watched, not just awaited: the
prober's bytes acknowledged (TCP_INFO) going up, then the bytes received; nothing moving for
``stall_s`` is a stall, and a transfer still moving when ``budget_s`` ends is measured as far
as it got (a slow link is a figure, not a failure).

This module holds the protocol and the prober's end; the window's end is net/datawindow.py.
"""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec

from rallypoint.net import tcpinfo

#: What every probed pair moves each way: far more than a few full-size segments.
PATH_BYTES = 64 * 1024
#: The most one request may ask for, each way.
MAX_DATA_BYTES = 16 * 1024 * 1024
#: How often a transfer's progress is read from the kernel.
POLL_S = 0.05
#: Each end writes its bytes in pieces of this size (zeros from one buffer); the prober reads so.
CHUNK = 256 * 1024
ZEROS = bytes(CHUNK)

ACK = b"RPACK/1\n"
STAT_ASK = b"RPSTAT/1\n"
REQUEST = re.compile(rb"RPDATA/1 (\d{1,9}) (\d{1,9}) ([0-9a-f]{64})\r?\n")
_STAT = re.compile(rb"RPSTAT/1 (\d{1,20}) (\d{1,20}) (\d{1,20})\r?\n")
#: Longest protocol line either end reads.
MAX_LINE = 256


class DataRequest(msgspec.Struct, frozen=True):
    """What a probe asks of the data leg: bytes each way, the stall limit and the budget."""

    up: int
    down: int
    stall_s: float
    budget_s: float
    #: Clamp the connection's MSS (TCP_MAXSEG) to find the largest packet that passes.
    mss: int | None = None


class Transfer(msgspec.Struct, frozen=True):
    """What the data leg moved. ``cause``: ok, stalled, garbled or closed."""

    cause: str
    detail: str
    up_bytes: int
    down_bytes: int
    up_s: float
    down_s: float
    #: Every asked byte moved within the budget.
    complete: bool
    #: The MTU of the route the connection took (tcpinfo.route_mtu): the size full-size
    #: segments fill, and the top of a search for the size that passes.
    route_mtu: int | None = None
    #: The prober's counters of the up leg (deltas over the data leg, read at the ACK).
    up_sent: int | None = None
    up_retrans_bytes: int | None = None
    rtt_us: int | None = None
    #: The window's counters of the down leg (bytes sent, retransmitted) and its timing.
    peer_sent: int | None = None
    peer_retrans: int | None = None
    peer_leg_us: int | None = None

    @property
    def ok(self) -> bool:
        return self.cause == "ok"

    @property
    def up_mbps(self) -> float:
        return _mbps(self.up_bytes, self.up_s)

    @property
    def down_mbps(self) -> float:
        """The window's timing of its leg where it gave one: the prober only sees the bytes
        once it reads them, and a receive buffer can hold the whole leg by then."""
        if self.complete and self.peer_leg_us:
            return _mbps(self.down_bytes, self.peer_leg_us / 1e6)
        return _mbps(self.down_bytes, self.down_s)

    @property
    def up_retrans(self) -> float | None:
        if self.up_sent is None or self.up_retrans_bytes is None:
            return None
        return self.up_retrans_bytes / self.up_sent if self.up_sent else 0.0

    @property
    def down_retrans(self) -> float | None:
        if self.peer_sent is None or self.peer_retrans is None:
            return None
        return self.peer_retrans / self.peer_sent if self.peer_sent else 0.0


def _mbps(count: int, seconds: float) -> float:
    return count * 8 / seconds / 1e6 if seconds > 0 else 0.0


#: The largest MSS TCP_MAXSEG takes (Linux's MAX_TCP_WINDOW): a path-MTU search stops there.
MAX_MSS = 32767


def clamp_mss(sock: socket.socket, mss: int) -> None:
    """Set TCP_MAXSEG before connecting: both ends' segments then carry at most ``mss``."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)


async def exchange(sock: socket.socket, request: DataRequest, mac: str) -> Transfer:
    """Run the prober's side of the data leg on a connected, answered probe socket."""
    loop = asyncio.get_running_loop()
    before = tcpinfo.read(sock)
    base_acked = (before.bytes_acked or 0) if before is not None else 0
    header = b"RPDATA/1 %d %d %s\n" % (request.up, request.down, mac.encode())
    state = _Reading(request.down)
    started = time.monotonic()
    sending = asyncio.ensure_future(_send(loop, sock, header, request.up))
    reading = asyncio.ensure_future(state.run(loop, sock))
    try:
        cause, detail = await _watch(
            sock, request, state, reading, started=started, base_acked=base_acked + len(header)
        )
    finally:
        for task in (sending, reading):
            task.cancel()
        await asyncio.gather(sending, reading, return_exceptions=True)
    now = time.monotonic()
    acked_at = state.acked_at
    complete = cause == "ok" and state.done_at is not None
    peer = await _peer_stats(loop, sock, request.stall_s) if complete else None
    up_sent, up_retrans_bytes = counter_deltas(before, state.at_ack)
    return Transfer(
        cause=cause,
        detail=detail,
        up_bytes=request.up if acked_at is not None else state.acked,
        down_bytes=state.got,
        up_s=(acked_at if acked_at is not None else now) - started,
        down_s=0.0 if acked_at is None else (state.done_at or now) - acked_at,
        complete=complete,
        route_mtu=tcpinfo.route_mtu(sock),
        up_sent=up_sent,
        up_retrans_bytes=up_retrans_bytes,
        rtt_us=None if state.at_ack is None else state.at_ack.min_rtt_us,
        peer_sent=None if peer is None else peer[0],
        peer_retrans=None if peer is None else peer[1],
        peer_leg_us=None if peer is None else peer[2],
    )


async def _send(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, header: bytes, up: int
) -> None:
    """The request line, then ``up`` bytes of zeros."""
    await loop.sock_sendall(sock, header)
    left = up
    while left > 0:
        step = min(left, CHUNK)
        await loop.sock_sendall(sock, memoryview(ZEROS)[:step])
        left -= step


async def _watch(
    sock: socket.socket,
    request: DataRequest,
    state: _Reading,
    reading: asyncio.Future[None],
    *,
    started: float,
    base_acked: int,
) -> tuple[str, str]:
    """Follow the transfer until it ends, stalls or spends its budget: (cause, detail).

    ``base_acked`` is the socket's bytes acknowledged before the data leg, request included.
    """
    last: tuple[int, int] = (-1, -1)
    last_change = started
    while not reading.done():
        await asyncio.wait({reading}, timeout=POLL_S)
        now = time.monotonic()
        stats = tcpinfo.read(sock)
        acked = max(0, (stats.bytes_acked or 0) - base_acked) if stats else 0
        state.acked = min(acked, request.up)
        progress = (state.acked, state.got)
        if progress != last:
            last, last_change = progress, now
        elif now - last_change > request.stall_s and not reading.done():
            leg = "up" if state.acked_at is None else "down"
            moved = state.acked if leg == "up" else state.got
            asked = request.up if leg == "up" else request.down
            return "stalled", f"data stopped after {moved} of {asked} bytes {_LEGS[leg]}"
        if now - started > request.budget_s and not reading.done():
            return "ok", ""  # still moving: measured as far as it got
    exc = reading.exception()
    if exc is None:
        return "ok", ""
    cause = "garbled" if isinstance(exc, _Garbled) else "closed"
    return cause, str(exc) or "the window closed the connection during the transfer"


def counter_deltas(
    before: tcpinfo.TcpStats | None, after: tcpinfo.TcpStats | None
) -> tuple[int | None, int | None]:
    """(bytes sent, bytes retransmitted) between two readings."""
    if before is None or after is None:
        return None, None

    def minus(a: int | None, b: int | None) -> int | None:
        return None if a is None or b is None else max(0, a - b)

    return (
        minus(after.bytes_sent, before.bytes_sent),
        minus(after.bytes_retrans, before.bytes_retrans),
    )


_LEGS = {"up": "towards it", "down": "from it"}


class _Garbled(Exception):
    """The window answered the data request with something else than the protocol."""


class _Reading:
    """The prober's read side: the ACK line, then ``down`` bytes."""

    def __init__(self, down: int) -> None:
        self.down = down
        self.got = 0
        self.acked = 0
        self.acked_at: float | None = None
        self.done_at: float | None = None
        #: The prober's counters when the ACK arrived: the up leg is over.
        self.at_ack: tcpinfo.TcpStats | None = None

    async def run(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        buffer = b""
        while ACK not in buffer:
            chunk = await loop.sock_recv(sock, MAX_LINE)
            if not chunk:
                raise ConnectionResetError("the window closed the connection before its ACK")
            buffer += chunk
            if not ACK.startswith(buffer[: len(ACK)]) or len(buffer) > MAX_LINE + self.down:
                raise _Garbled(f"the window answered {buffer[:40]!r}, not {ACK!r}")
        self.acked_at = time.monotonic()
        self.at_ack = tcpinfo.read(sock)
        self.got = len(buffer) - len(ACK)
        sink = bytearray(CHUNK)
        while self.got < self.down:
            count = await loop.sock_recv_into(sock, sink)
            if not count:
                raise ConnectionResetError(
                    f"the window closed the connection after {self.got} of {self.down} bytes"
                )
            self.got += count
        if self.got > self.down:
            raise _Garbled(f"the window sent {self.got} bytes, {self.down} were asked")
        self.done_at = time.monotonic()


async def _peer_stats(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, timeout_s: float
) -> tuple[int, int, int] | None:
    """The window's counters of the down leg, or None when it does not say in time."""
    try:
        async with asyncio.timeout(timeout_s):
            await loop.sock_sendall(sock, STAT_ASK)
            line = b""
            while not line.endswith(b"\n") and len(line) <= MAX_LINE:
                chunk = await loop.sock_recv(sock, MAX_LINE)
                if not chunk:
                    return None
                line += chunk
    except (TimeoutError, OSError):
        return None
    match = _STAT.fullmatch(line)
    if match is None:
        return None
    sent, retrans, leg_us = (int(g) for g in match.groups())
    if retrans > sent:
        return None
    return sent, retrans, leg_us


#: A path-MTU search stops once the size is known to this many bytes (or after SEARCH_ROUNDS).
SEARCH_PRECISION = 8
SEARCH_ROUNDS = 4


async def largest_passing(
    low: int, high: int, passes: Callable[[int], Awaitable[bool]], *, per_round: int = 12
) -> int | None:
    """The largest size in [low, high] for which ``passes`` holds, to within a few units.

    Rounds of ``per_round`` sizes tried at once (each a probe with a clamped MSS, so a round
    costs one stall limit, not one per size): evenly over [low, high], then evenly between
    the largest that passed and the next that did not, until the two are SEARCH_PRECISION
    apart (two rounds from 1500, four from loopback's 65536). None when ``low`` fails too.
    """
    lo, hi = low, high
    best: int | None = None
    for _ in range(SEARCH_ROUNDS):
        sizes = sorted({lo + (hi - lo) * i // per_round for i in range(per_round + 1)})
        results = await asyncio.gather(*(passes(size) for size in sizes))
        passed = [size for size, ok in zip(sizes, results, strict=True) if ok]
        if not passed:
            return best
        top = max(passed)
        best = top if best is None else max(best, top)
        failed = [size for size, ok in zip(sizes, results, strict=True) if not ok and size > top]
        if not failed:
            return best
        lo, hi = top, min(failed)
        if hi - lo <= SEARCH_PRECISION:
            return best
    return best
