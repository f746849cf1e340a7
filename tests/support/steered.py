"""A Cluster whose probes from one rank to one host can be sent elsewhere: a drop, a
reject or a stranger for one pair, while every other probe goes to loopback."""

from __future__ import annotations

import socket

from rallypoint.net import probe
from tests.support.cluster.inprocess import Cluster


class Steered(Cluster):
    """A Cluster whose probes from one rank to one host can be redirected."""

    def __init__(self, n: int, **kwargs: object) -> None:
        super().__init__(n, **kwargs)  # type: ignore[arg-type]
        #: (source rank, target host, kind or None for every port) -> (address, port)
        self.detours: dict[tuple[int, str], tuple[str, int]] = {}

    def route_for(self, rank: int) -> probe.ProbeRoute:
        def route(host: str, _address: str, port: int) -> tuple[str, int]:
            return self.detours.get((rank, host), ("127.0.0.1", port))

        return route


async def start_steered(c: Steered) -> None:
    for rank in range(c.n):
        c.route = c.route_for(rank)  # type: ignore[method-assign]
        await c.start(rank)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


FAST = {"probe_timeout_s": 0.3}
