"""Whether real mDNS can run on loopback here: the prerequisite of every loopback mDNS test."""

from __future__ import annotations

import socket
import struct


def loopback_multicast_works() -> bool:
    """Whether a multicast datagram sent on 127.0.0.1 comes back (lo often lacks MULTICAST)."""
    group = "224.0.0.251"
    try:
        with (
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx,
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx,
        ):
            rx.bind(("0.0.0.0", 0))
            port = rx.getsockname()[1]
            rx.setsockopt(
                socket.IPPROTO_IP,
                socket.IP_ADD_MEMBERSHIP,
                socket.inet_aton(group) + socket.inet_aton("127.0.0.1"),
            )
            rx.settimeout(1.0)
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton("127.0.0.1"))
            tx.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, struct.pack("b", 1))
            tx.sendto(b"rallypoint-probe", (group, port))
            return rx.recv(64) == b"rallypoint-probe"
    except OSError:
        return False
