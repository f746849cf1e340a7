"""`rallypoint demo`: N sidecars of one session on this machine, in one process.

Each node gets a name (node0, node1, ...) that an in-memory table resolves to its own
127.77.0.x address (Linux routes all of 127/8 to the loopback interface), so /etc/hosts is
never touched; every node binds its peer API on that address and the usual peer port.
Loopback answers are accepted (all nodes share this host); mDNS and the local API stay off.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Mapping
from contextlib import AsyncExitStack

from msgspec.structs import replace

from rallypoint.errors import ConfigError, RendezvousTimeout
from rallypoint.model import ClusterSpec, Env
from rallypoint.settings import Settings
from rallypoint.sidecar import Sidecar

MAX_NODES = 64


class StaticResolver:
    """A Resolver over a fixed table of names: what /etc/hosts would say, without the file."""

    def __init__(self, table: Mapping[str, list[str]]) -> None:
        self._table = {host: list(addresses) for host, addresses in table.items()}

    async def lookup(self, host: str) -> list[str]:
        """The table's addresses for ``host``; socket.gaierror when the name is unknown."""
        try:
            return list(self._table[host])
        except KeyError:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None


def demo_hosts(nodes: int) -> dict[str, str]:
    """Host name -> loopback address of each demo node, in rank order."""
    return {f"node{rank}": f"127.77.0.{rank + 1}" for rank in range(nodes)}


async def run(nodes: int, settings: Settings) -> list[tuple[int, Env, float]]:
    """Run ``nodes`` sidecars until all are ready; (rank, env, seconds to ready) for each."""
    if not 1 <= nodes <= MAX_NODES:
        raise ConfigError(f"--nodes {nodes} must be between 1 and {MAX_NODES}")
    table = demo_hosts(nodes)
    hosts = tuple(table)
    resolver = StaticResolver({host: [address] for host, address in table.items()})
    session = f"demo-{secrets.token_hex(4)}"
    async with AsyncExitStack() as stack:
        sidecars: list[Sidecar] = []
        taken: set[int] = set()
        for rank, host in enumerate(hosts):
            node_settings = replace(
                settings,
                local_hosts=(),
                peer_host=table[host],
                mdns=False,
                allow_loopback=True,
                metrics_port=None,  # N nodes on one host would share one port
            )
            spec = ClusterSpec(
                provider="demo",
                hosts=hosts,
                rank=rank,
                nnodes=nodes,
                session=session,
                loopback_ok=True,
            )
            sidecar = Sidecar(
                node_settings,
                {},
                resolver=resolver,
                spec=spec,
                addresses=[table[host]],
                avoid_ports=taken,
            )
            await stack.enter_async_context(sidecar)
            # Every node holds its ports on this one host: keep the next one off them.
            taken.update(sidecar.held_ports)
            sidecars.append(sidecar)
        ready = await asyncio.gather(
            *(sidecar.node.readiness.wait_ready(settings.deadline_s) for sidecar in sidecars)
        )
        results: list[tuple[int, Env, float]] = []
        for sidecar, ok in zip(sidecars, ready, strict=True):
            node = sidecar.node
            env = node.readiness.env
            if not ok or env is None:
                codes = ", ".join(f"{r.code}: {r.message}" for r in node.readiness.reasons())
                raise RendezvousTimeout(
                    f"demo node {node.spec.host} not ready within {settings.deadline_s:g}s: {codes}"
                )
            results.append((node.spec.rank, env, node.readiness.ready_after_s or 0.0))
        return results
