"""The window's end of the data leg: check the request, take its bytes, send ours, report.

The protocol and the prober's end are in net/datapath.py; probe._Answer feeds this end the
bytes that follow a probe's answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from rallypoint.net import tcpinfo
from rallypoint.net.datapath import (
    ACK,
    CHUNK,
    MAX_DATA_BYTES,
    MAX_LINE,
    REQUEST,
    STAT_ASK,
    ZEROS,
    counter_deltas,
)

#: A window gives a prober this long to finish its transfer, then closes.
SERVE_MAX_S = 60.0


def stat_line(before: tcpinfo.TcpStats | None, now: tcpinfo.TcpStats | None, leg_s: float) -> bytes:
    """The window's answer to RPSTAT/1: its counters of the down leg (zeros if unknown)."""
    sent, retrans = counter_deltas(before, now)
    leg_us = max(1, int(leg_s * 1e6))
    return b"RPSTAT/1 %d %d %d\n" % (sent or 0, retrans or 0, leg_us)


class WindowData:
    """A window's side of the data leg on one answered connection (probe._Answer feeds it).

    ``check(up, down, mac)`` says whether a request is genuine. Everything arriving before a
    valid request, or more than was asked, is garbage: the connection is closed.
    """

    def __init__(
        self,
        transport: asyncio.Transport,
        check: Callable[[int, int, str], bool],
        count: Callable[[str, int], None],
    ) -> None:
        self.transport = transport
        self._check = check
        self._count = count  # (direction, bytes) for the metrics
        self.state = "request"  # request, receiving, sending, stat, done
        self.buffer = b""
        self.up = self.down = 0
        self.received = 0
        self.to_send = 0
        self.paused = False
        self._before: tcpinfo.TcpStats | None = None
        self._sending_at = 0.0

    def _read(self) -> tcpinfo.TcpStats | None:
        sock = self.transport.get_extra_info("socket")
        return None if sock is None else tcpinfo.read(sock)

    def feed(self, data: bytes) -> str | None:
        """Take bytes from the prober; a result to close with ("garbage"), else None."""
        if self.state == "receiving":
            self.received += len(data)
            self._count("received", len(data))
            if self.received > self.up:
                return "garbage"
            if self.received == self.up:
                self._start_sending()
            return None
        self.buffer += data
        if b"\n" not in self.buffer:
            return "garbage" if len(self.buffer) > MAX_LINE else None
        line, _, rest = self.buffer.partition(b"\n")
        line += b"\n"
        self.buffer = b""
        if self.state == "request":
            match = REQUEST.fullmatch(line)
            if match is None:
                return "garbage"
            up, down = int(match.group(1)), int(match.group(2))
            if up > MAX_DATA_BYTES or down > MAX_DATA_BYTES:
                return "garbage"
            if not self._check(up, down, match.group(3).decode()):
                return "garbage"
            self.up, self.down, self.state = up, down, "receiving"
            self._before = self._read()
            if up == 0:
                self._start_sending()
            if rest:
                return self.feed(rest)
            return None
        if self.state == "stat" and line.rstrip(b"\r\n") == STAT_ASK.rstrip(b"\n") and not rest:
            leg_s = time.monotonic() - self._sending_at
            self.transport.write(stat_line(self._before, self._read(), leg_s))
            self.state = "done"
            return None
        return "garbage"

    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        self.paused = False
        self._send_more()

    def _start_sending(self) -> None:
        self.state = "sending"
        self._sending_at = time.monotonic()
        self.to_send = self.down
        self.transport.write(ACK)
        self._send_more()

    def _send_more(self) -> None:
        # Respect the transport's flow control: a flood of probers must not make the
        # window buffer MAX_DATA_BYTES per connection in memory.
        while self.state == "sending" and self.to_send > 0 and not self.paused:
            step = min(self.to_send, CHUNK)
            self.to_send -= step
            self._count("sent", step)
            self.transport.write(memoryview(ZEROS)[:step])
        if self.state == "sending" and self.to_send == 0:
            self.state = "stat"
