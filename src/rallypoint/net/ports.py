"""Choose a free TCP port outside the ephemeral range and hold it for the sidecar's lifetime.

A held port is a socket bound to the wildcard address *without* SO_REUSEADDR (so the bind
itself is the free-port test and nobody can slip in between test and hold), with SO_REUSEADDR
switched on right after the bind, and never listening. Measured on Linux: holding 0.0.0.0 and
:: with IPV6_V6ONLY=1 makes every plain bind of the port fail (0.0.0.0, 127.0.0.1, :: dual-stack
and v6-only, ::1), while a listener that sets SO_REUSEADDR before its bind, as torch's TCPStore
and gRPC do, binds and listens on 0.0.0.0, on :: (dual-stack or not) and on loopback. The kernel
allows the second bind because both sockets have SO_REUSEADDR and the held one is not listening.
Explicit V6ONLY keeps the two holds independent of net.ipv6.bindv6only. A port with
connections still in TIME_WAIT fails the plain bind too, so it counts as in use until they
expire (60 s on Linux): a restarted master may then hold the next port of the range.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Collection, Sequence
from types import TracebackType

import msgspec

from rallypoint.errors import PortError

#: Linux's default net.ipv4.ip_local_port_range, used when /proc cannot be read.
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)

_EPHEMERAL_RANGE_PATH = "/proc/sys/net/ipv4/ip_local_port_range"

# Errors that mean "this address family is not available here", not "the port is taken":
# no IPv6 in the kernel, or IPv6 disabled by sysctl (binding :: then fails with EADDRNOTAVAIL).
_FAMILY_UNAVAILABLE = frozenset({errno.EAFNOSUPPORT, errno.EPROTONOSUPPORT, errno.EADDRNOTAVAIL})


def ephemeral_range(path: str = _EPHEMERAL_RANGE_PATH) -> tuple[int, int]:
    """The kernel's ephemeral port range from ``path``; Linux's default when it is unreadable."""
    try:
        with open(path, encoding="ascii") as handle:
            low_text, high_text = handle.read().split()
        low, high = int(low_text), int(high_text)
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    if not 1 <= low <= high <= 65535:
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


class Skipped(msgspec.Struct, frozen=True):
    """A preferred port that was passed over, and why (shown in /status)."""

    port: int
    reason: str


class HeldPort:
    """A port held by bound, non-listening SO_REUSEADDR sockets until :meth:`close`."""

    def __init__(
        self, port: int, sockets: Sequence[socket.socket], skipped: Sequence[Skipped] = ()
    ) -> None:
        self.port = port
        self.skipped = tuple(skipped)
        self._sockets = list(sockets)

    @property
    def held(self) -> bool:
        """True until :meth:`close` released the port."""
        return bool(self._sockets)

    def close(self) -> None:
        """Release the port; closing twice is safe."""
        sockets, self._sockets = self._sockets, []
        for sock in sockets:
            sock.close()

    def listen(self, backlog: int = 128) -> list[socket.socket]:
        """Listening SO_REUSEADDR sockets on the held port, one per held family (the window).

        The hold stays: closing the returned sockets ends the window and leaves the port
        exactly as held before, so the training process's own SO_REUSEADDR listener binds it
        afterwards. PortError when another listener is on the port already (the job's own
        TCPStore or gRPC server: Linux lets only one socket listen there) or it is not held.
        """
        if not self._sockets:
            raise PortError(f"port {self.port} is not held")
        listening: list[socket.socket] = []
        for held in self._sockets:
            family = held.family
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(held.getsockname()[:2])
                sock.listen(backlog)
                sock.setblocking(False)
            except OSError as exc:
                sock.close()
                _close_all(listening)
                raise PortError(f"port {self.port} cannot listen: {_reason(exc)}") from exc
            listening.append(sock)
        return listening

    def __enter__(self) -> HeldPort:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "held" if self._sockets else "closed"
        return f"HeldPort(port={self.port}, {state}, skipped={self.skipped!r})"


def reserve(
    preferred: Sequence[int],
    port_range: tuple[int, int],
    *,
    avoid: Collection[int] = (),
    exact: bool = False,
) -> HeldPort:
    """Hold the first free preferred port, else the first free one in ``port_range``.

    Ports inside the ephemeral range and in ``avoid`` are never taken. With ``exact`` only
    the preferred ports are tried, ephemeral ones included: the user chose them, and the
    range exclusion is for ports rallypoint picks itself. Raises PortError when nothing is free.
    """
    low, high = port_range
    if not 1 <= low <= high <= 65535:
        raise PortError(
            f"port range {low}-{high} is not a range of ports; "
            "set RALLYPOINT_PORT_RANGE to LOW-HIGH within 1-65535"
        )
    ephemeral = ephemeral_range()
    avoided = frozenset(avoid)
    skipped: list[Skipped] = []
    for port in dict.fromkeys(preferred):
        reason = _unusable(port, ephemeral, avoided, exact=exact)
        if reason is None:
            held = _hold(port)
            if isinstance(held, list):
                return HeldPort(port, held, skipped)
            reason = held
        skipped.append(Skipped(port, reason))
    passed_over = "".join(f"; {s.port} {s.reason}" for s in skipped)
    if exact:
        wanted = ", ".join(str(port) for port in preferred)
        raise PortError(f"port {wanted} cannot be held{passed_over}; free it or choose another")

    tried = frozenset(preferred)
    for port in range(low, high + 1):
        if port in tried or _unusable(port, ephemeral, avoided, exact=exact) is not None:
            continue
        held = _hold(port)
        if isinstance(held, list):
            return HeldPort(port, held, skipped)

    eph_low, eph_high = ephemeral
    raise PortError(
        f"no free port in {low}-{high} outside the ephemeral range {eph_low}-{eph_high}"
        f"{passed_over}; free a port there or set RALLYPOINT_PORT_RANGE to a wider range"
    )


def _unusable(
    port: int, ephemeral: tuple[int, int], avoided: Collection[int], *, exact: bool
) -> str | None:
    """Why ``reserve`` may not take ``port`` (ephemeral ports only unless ``exact``), or None."""
    if not 1 <= port <= 65535:
        return "not a port number (1-65535)"
    eph_low, eph_high = ephemeral
    if not exact and eph_low <= port <= eph_high:
        return f"inside the ephemeral range {eph_low}-{eph_high}"
    if port in avoided:
        return "already taken by another port of this sidecar"
    return None


def reserve_ephemeral(attempts: int = 16) -> HeldPort:
    """Hold a port the kernel picks from its ephemeral range, on both families where available.

    gloo and NCCL listen on such ports, so a probe to one crosses the same firewall rules
    the job's own connections will. PortError when no port is free on both families.
    """
    last = "no attempt made"
    for _ in range(attempts):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as picker:
            try:
                picker.bind(("0.0.0.0", 0))
            except OSError as exc:
                raise PortError(f"no ephemeral port can be bound: {_reason(exc)}") from exc
            port = int(picker.getsockname()[1])
        held = _hold(port)
        if isinstance(held, list):
            return HeldPort(port, held)
        last = f"{port} {held}"
    raise PortError(f"no ephemeral port could be held on IPv4 and IPv6 (last: {last})")


def _hold(port: int) -> list[socket.socket] | str:
    """Bind ``port`` on 0.0.0.0 and on :: (v6-only); the sockets, or why the port is not free."""
    held: list[socket.socket] = []
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            if exc.errno in _FAMILY_UNAVAILABLE:
                continue
            _close_all(held)
            return _reason(exc)
        try:
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            # A plain bind first: it fails when anyone holds the port in any way, including
            # another sidecar's hold. Only then allow SO_REUSEADDR listeners to share it.
            sock.bind((address, port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        except OSError as exc:
            sock.close()
            if family == socket.AF_INET6 and exc.errno in _FAMILY_UNAVAILABLE:
                continue
            _close_all(held)
            return _reason(exc)
        held.append(sock)
    if not held:
        return "neither IPv4 nor IPv6 is available"
    return held


def _close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def _reason(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "in use"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    return os.strerror(exc.errno) if exc.errno else str(exc)
