"""What the kernel knows of one TCP connection (Linux TCP_INFO): bytes, retransmits, RTT.

The layout is ``struct tcp_info`` of linux/tcp.h; fields that an older kernel does not fill
(the struct grows at its end) read as None. Nothing here fails: a socket that cannot be
asked (not TCP, not Linux, closed) gives None.
"""

from __future__ import annotations

import socket
import struct
from typing import Protocol

import msgspec

#: Bytes asked for: the struct as of Linux 6.x is 280; the kernel copies what it has.
_ASK = 512
_U32 = struct.Struct("=I")
_U64 = struct.Struct("=Q")
# Offsets in struct tcp_info (linux/tcp.h).
_BYTES_ACKED, _MIN_RTT = 120, 148
_BYTES_SENT, _BYTES_RETRANS = 200, 208


class TcpStats(msgspec.Struct, frozen=True):
    """One reading of a connection's counters (None: the kernel does not report it)."""

    min_rtt_us: int | None = None
    bytes_acked: int | None = None
    bytes_sent: int | None = None
    bytes_retrans: int | None = None


def parse(raw: bytes) -> TcpStats:
    """A TCP_INFO buffer as TcpStats; fields beyond its length are None."""

    def u32(offset: int) -> int | None:
        return _U32.unpack_from(raw, offset)[0] if len(raw) >= offset + 4 else None

    def u64(offset: int) -> int | None:
        return _U64.unpack_from(raw, offset)[0] if len(raw) >= offset + 8 else None

    return TcpStats(
        min_rtt_us=u32(_MIN_RTT),
        bytes_acked=u64(_BYTES_ACKED),
        bytes_sent=u64(_BYTES_SENT),
        bytes_retrans=u64(_BYTES_RETRANS),
    )


class Sockopts(Protocol):
    """What reading TCP_INFO needs of a socket (a socket, or asyncio's TransportSocket)."""

    def getsockopt(self, level: int, option: int, buflen: int, /) -> bytes: ...


#: getsockopt options for a connected socket's path MTU (linux/in.h, linux/in6.h; Python's
#: socket module does not name them).
_IP_MTU, _IPV6_MTU = 14, 24


def route_mtu(sock: socket.socket) -> int | None:
    """The MTU of the route a connected socket uses (its interface's, unless a route or
    ICMP lowered it), or None when the kernel will not say."""
    if sock.family == socket.AF_INET6:
        level, option = socket.IPPROTO_IPV6, _IPV6_MTU
    else:
        level, option = socket.IPPROTO_IP, _IP_MTU
    try:
        return sock.getsockopt(level, option)
    except OSError:
        return None


def read(sock: Sockopts) -> TcpStats | None:
    """The connection's counters now, or None when the kernel will not say."""
    option = getattr(socket, "TCP_INFO", None)
    if option is None:
        return None
    try:
        return parse(sock.getsockopt(socket.IPPROTO_TCP, option, _ASK))
    except OSError:
        return None
