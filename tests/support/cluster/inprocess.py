"""N sidecars of one session in one event loop on loopback ports, each with its own resolver.

Peer addressing: every node's name resolves (in its own FakeResolver) to a documentation
address 198.51.100.x, and the endpoint seam maps (host, address) to 127.0.0.1 and that
host's own peer port, so resolution verdicts stay realistic while traffic stays on loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from rallypoint.auth import LOCAL_PROOF_HEADER, Authenticator
from rallypoint.model import ClusterSpec
from rallypoint.settings import Settings
from rallypoint.sidecar import Sidecar
from tests.fakes import FakeResolver
from tests.support.ports import free_port
from tests.support.settings import fast_settings

SESSION = "sess-1"


@dataclass
class Cluster:
    """N nodes of one session; start and stop each at will."""

    n: int
    token: str | None = None
    per_node: dict[int, dict[str, object]] = field(default_factory=dict)
    hosts: tuple[str, ...] = ()
    resolvers: list[FakeResolver] = field(default_factory=list)
    peer_ports: dict[str, int] = field(default_factory=dict)
    local_ports: dict[int, int] = field(default_factory=dict)
    nodes: dict[int, Sidecar] = field(default_factory=dict)
    #: The addresses a node reports for itself, where not just address(rank).
    addresses: dict[int, list[str]] = field(default_factory=dict)
    #: A node's wall clock, where not time.time (a skewed clock: lambda: time.time() + 600).
    clocks: dict[int, Callable[[], float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.hosts = tuple(f"node{r}" for r in range(self.n))
        table = {h: [address(r)] for r, h in enumerate(self.hosts)}
        self.resolvers = [FakeResolver(table) for _ in range(self.n)]
        self.peer_ports = {h: free_port() for h in self.hosts}
        self.local_ports = {r: free_port() for r in range(self.n)}

    def endpoint(self, host: str, _address: str) -> tuple[str, int]:
        return "127.0.0.1", self.peer_ports[host]

    def route(self, _host: str, _address: str, port: int) -> tuple[str, int]:
        """Probes keep their port but go to loopback, where every node holds its own."""
        return "127.0.0.1", port

    def settings(self, rank: int) -> Settings:
        changes: dict[str, object] = {
            "local_port": self.local_ports[rank],
            "peer_port": self.peer_ports[self.hosts[rank]],
            "token": self.token,
        }
        changes.update(self.per_node.get(rank, {}))
        return fast_settings(**changes)

    async def start(self, rank: int) -> Sidecar:
        spec = ClusterSpec("explicit", self.hosts, rank, self.n, SESSION)
        sidecar = Sidecar(
            self.settings(rank),
            {},
            resolver=self.resolvers[rank],
            spec=spec,
            addresses=self.addresses.get(rank, [address(rank)]),
            endpoint=self.endpoint,
            route=self.route,
            wall_clock=self.clocks.get(rank, time.time),
        )
        await sidecar.start()
        self.nodes[rank] = sidecar
        return sidecar

    async def stop(self, rank: int) -> None:
        """Stop the sidecar as SIGTERM does: it says goodbye, and the others show it left."""
        await self.nodes.pop(rank).stop()

    async def kill(self, rank: int) -> None:
        """Stop the sidecar without a goodbye, as a crash would: the others name it down."""
        await self.nodes.pop(rank).stop(goodbye=False)

    async def close(self) -> None:
        for rank in sorted(self.nodes, reverse=True):
            await self.stop(rank)

    def peer_url(self, rank: int, path: str) -> str:
        return f"http://127.0.0.1:{self.peer_ports[self.hosts[rank]]}{path}"

    def local_url(self, rank: int, path: str) -> str:
        return f"http://127.0.0.1:{self.local_ports[rank]}{path}"

    def run_env(self) -> dict[str, str]:
        """What `rallypoint run` needs beside its local port: the session token, when set."""
        return {} if self.token is None else {"RALLYPOINT_TOKEN": self.token}

    def write_headers(self) -> dict[str, str]:
        """The header that proves the token on a local write, as `run` sends it."""
        if self.token is None:
            return {}
        return {LOCAL_PROOF_HEADER: "Bearer " + Authenticator(self.token).local_proof()}


def address(rank: int) -> str:
    return f"198.51.100.{rank + 10}"


@asynccontextmanager
async def cluster(n: int, **kwargs: object) -> AsyncIterator[Cluster]:
    c = Cluster(n, **kwargs)  # type: ignore[arg-type]
    try:
        yield c
    finally:
        await c.close()


@asynccontextmanager
async def ready_cluster(n: int, **kwargs: object) -> AsyncIterator[Cluster]:
    """A cluster of n nodes, every one started and ready."""
    async with cluster(n, **kwargs) as c:
        await start_all(c)
        await all_ready(c)
        yield c


async def start_all(c: Cluster) -> None:
    for rank in range(c.n):
        await c.start(rank)


async def all_ready(c: Cluster, timeout_s: float = 20.0) -> None:
    results = await asyncio.gather(
        *(s.node.readiness.wait_ready(timeout_s) for s in c.nodes.values())
    )
    not_ready = {
        r: [x.as_json() for x in s.node.readiness.reasons()]
        for (r, s), ok in zip(c.nodes.items(), results, strict=True)
        if not ok
    }
    assert not not_ready, not_ready


async def until(predicate: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll ``predicate`` (no timing assertion: the timeout only stops a hung test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < end, "condition never held"
        await asyncio.sleep(0.01)


async def moved_on(c: Cluster, old: str | None) -> None:
    """Every node on a generation other than ``old``, and ready on it."""
    await until(
        lambda: all(s.node.verification.generation not in (None, old) for s in c.nodes.values())
    )
    await all_ready(c)


async def restart(c: Cluster, rank: int) -> str | None:
    """Stop and start one node, then wait until every node is ready on a new generation;
    the generation before, which no node serves any longer."""
    old = c.nodes[(rank + 1) % c.n].node.verification.generation
    await c.stop(rank)
    await c.start(rank)
    await moved_on(c, old)
    return old


async def tried_the_master(c: Cluster, ranks: Iterable[int], timeout_s: float = 20.0) -> None:
    """Each of ``ranks`` counted at least one join attempt that found no master."""
    wanted = tuple(ranks)

    def tried(rank: int) -> bool:
        metrics = c.nodes[rank].metrics
        return metrics.value("rallypoint_join_attempts_total", result="master_unreachable") >= 1

    await until(lambda: all(tried(rank) for rank in wanted), timeout_s=timeout_s)


def codes(sidecar: Sidecar) -> set[str]:
    return {r.code for r in sidecar.node.readiness.reasons()}
