"""Real mDNS on loopback for tests: whether it works here, and raw announcers of any record."""

from __future__ import annotations

import asyncio
import socket
import struct
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from rallypoint.mdns.txt import SERVICE_TYPE

LOOPBACK = ["127.0.0.1"]
#: Every test module that announces or browses with real mDNS on loopback. Loopback's
#: multicast is the host's: side by side these run on one worker (tests/conftest.py), since
#: a burst of another module's announcements can crowd out a goodbye a test waits for.
LOOPBACK_MDNS_TESTS = [
    "tests/inprocess/test_mdns.py",
    "tests/inprocess/test_sidecar_mdns.py",
    "tests/hardening/test_shutdown.py",
    "tests/hardening/test_auth_hardening.py",
]


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


Properties = Mapping[str | bytes, str | bytes | None]


@asynccontextmanager
async def rogues(*records: Properties) -> AsyncIterator[list[str]]:
    """Raw zeroconf announcers of SERVICE_TYPE with arbitrary TXT records; yields their labels."""
    labels = [f"rogue-{uuid.uuid4().hex[:8]}" for _ in records]
    async with AsyncZeroconf(interfaces=LOOPBACK, ip_version=IPVersion.V4Only) as azc:
        infos = [
            AsyncServiceInfo(
                SERVICE_TYPE,
                f"{label}.{SERVICE_TYPE}",
                port=7781,
                properties=dict(properties),
                server=f"{label}.local.",
                parsed_addresses=["127.0.0.1"],
            )
            for label, properties in zip(labels, records, strict=True)
        ]
        await asyncio.gather(*(azc.async_register_service(info) for info in infos))
        yield labels
