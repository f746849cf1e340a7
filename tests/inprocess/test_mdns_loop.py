"""The sidecar's mDNS loop against an in-memory view and node: discovery, the master fast path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import pytest

from rallypoint.errors import PortError
from rallypoint.mdns.loop import DiscoveryLoop
from rallypoint.mdns.txt import Announcement
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.net.ports import HeldPort
from rallypoint.reasons import Reason

SETTLE_S = 0.05
WAIT_S = 5.0


def ann(host: str, generation: str = "", instance: str | None = None) -> Announcement:
    return Announcement("s", host, -1, 7781, generation, ("10.0.0.1",), instance or f"s-{host}")


@dataclass
class FakeView:
    """An Mdns stand-in: peers are set by the test, which then sets `changed`."""

    host: str
    seen: list[Announcement] = field(default_factory=list)
    announced: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    fail_announce: bool = False

    def peers(self) -> list[Announcement]:
        return list(self.seen)

    async def announce(self, *, rank: int, generation: str, addresses: Sequence[str]) -> None:
        if self.fail_announce:
            raise OSError("no route")
        self.announced.append((rank, generation, tuple(addresses)))


@dataclass
class FakeVerification:
    """The node's verification as the loop reads it: the current document's generation."""

    generation: str | None = None


@dataclass
class FakeNode:
    """A Rendezvous stand-in that records what the loop told it."""

    spec: ClusterSpec
    verification: FakeVerification | None = None
    addresses: tuple[str, ...] = ("10.0.0.9",)
    reasons: list[Reason] = field(default_factory=list)
    failed: list[Reason] = field(default_factory=list)
    adopted: list[ClusterSpec] = field(default_factory=list)
    wakes: int = 0

    @property
    def spec_known(self) -> bool:
        return bool(self.spec.hosts)

    def adopt(self, spec: ClusterSpec, held: Mapping[str, HeldPort]) -> None:
        self.adopted.append(spec)
        self.spec = spec

    def discovering(self, reason: Reason) -> None:
        self.reasons.append(reason)

    def fail(self, reason: Reason) -> None:
        self.failed.append(reason)

    def wake(self) -> None:
        self.wakes += 1


def unknown(nnodes: int) -> ClusterSpec:
    return ClusterSpec(provider="mdns", hosts=(), rank=-1, nnodes=nnodes, session="s")


def known(rank: int) -> ClusterSpec:
    return ClusterSpec(provider="mdns", hosts=("a", "b"), rank=rank, nnodes=2, session="s")


def no_ports(spec: ClusterSpec) -> dict[str, HeldPort]:
    return {}


async def until(condition: Callable[[], object]) -> None:
    """Poll `condition`; the deadline only stops a hung test."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.01)


async def test_discovery_waits_for_nnodes_then_adopts_the_ranks() -> None:
    view, node, changed = FakeView("b", [ann("b")]), FakeNode(unknown(2)), asyncio.Event()
    loop = DiscoveryLoop(view, node, changed, Metrics(), settle_s=SETTLE_S)
    task = asyncio.create_task(loop.run(["10.0.0.9"], no_ports))
    try:
        await until(lambda: node.reasons)
        assert node.reasons[-1].code == "discovering"
        assert node.reasons[-1].detail == "1/2"
        assert view.announced[0] == (-1, "", ("10.0.0.9",))
        view.seen.append(ann("a"))
        changed.set()
        await until(lambda: node.adopted)
        assert node.adopted == [msgspec.structs.replace(unknown(2), hosts=("a", "b"), rank=1)]
        await until(lambda: len(view.announced) == 2)
        assert view.announced[1] == (1, "", ("10.0.0.9",))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_more_hosts_than_nnodes_is_a_conflict_not_a_spec() -> None:
    view, node = FakeView("a", [ann("a"), ann("b"), ann("c")]), FakeNode(unknown(2))
    loop = DiscoveryLoop(view, node, asyncio.Event(), Metrics(), settle_s=SETTLE_S)
    task = asyncio.create_task(loop.run([], no_ports))
    try:
        await until(lambda: node.reasons)
        assert node.reasons[-1].code == "discovery_conflict"
        assert node.reasons[-1].detail == "3/2"
        assert node.adopted == []
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_ports_that_cannot_be_held_fail_the_node() -> None:
    view, node = FakeView("a", [ann("a")]), FakeNode(unknown(1))

    def taken(spec: ClusterSpec) -> dict[str, HeldPort]:
        raise PortError("port 29500 is in use")

    loop = DiscoveryLoop(view, node, asyncio.Event(), Metrics(), settle_s=SETTLE_S)
    await asyncio.wait_for(loop.run([], taken), WAIT_S)
    assert [(r.code, r.host) for r in node.failed] == [("port_unavailable", "a")]
    assert node.adopted == []


async def test_a_master_returns_after_announcing() -> None:
    view, node = FakeView("a"), FakeNode(known(0), verification=FakeVerification("g1"))
    loop = DiscoveryLoop(view, node, asyncio.Event(), Metrics())
    await asyncio.wait_for(loop.run(["10.0.0.9"], no_ports), WAIT_S)
    assert view.announced == [(0, "g1", ("10.0.0.9",))]


async def test_a_worker_wakes_once_per_master_change() -> None:
    view, changed = FakeView("b"), asyncio.Event()
    node = FakeNode(known(1), verification=FakeVerification("g1"))
    metrics = Metrics()
    loop = DiscoveryLoop(view, node, changed, metrics)
    task = asyncio.create_task(loop.run([], no_ports))
    try:
        await until(lambda: view.announced)
        # The master on the worker's generation: nothing to do.
        view.seen = [ann("a", "g1")]
        changed.set()
        await until(lambda: not changed.is_set())
        assert node.wakes == 0
        # A new generation wakes the worker; seeing the same announcement again does not.
        for _ in range(2):
            view.seen = [ann("a", "g2"), ann("b", "g1")]
            changed.set()
            await until(lambda: not changed.is_set())
        assert node.wakes == 1
        # A restarted master (same name, no document yet) wakes it too.
        view.seen = [ann("a", "", instance="s-a-2")]
        changed.set()
        await until(lambda: node.wakes == 2)
        assert metrics.value("rallypoint_mdns_wakeups_total") == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_new_generation_is_announced_with_the_rank_and_addresses_of_now() -> None:
    view, node = FakeView("a"), FakeNode(known(0), verification=FakeVerification("g1"))
    loop = DiscoveryLoop(view, node, asyncio.Event(), Metrics())
    announcing = loop.announce_generation(ClusterDoc("s", "g2", "a", 29500, ()))
    node.addresses = ("10.0.0.10",)
    await announcing
    assert view.announced == [(0, "g2", ("10.0.0.9",))]


async def test_announce_failures_are_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    view = FakeView("a", fail_announce=True)
    node = FakeNode(known(0), verification=FakeVerification("g1"))
    loop = DiscoveryLoop(view, node, asyncio.Event(), Metrics())
    await loop.announce(0, "g1", [])
    assert view.announced == []
    assert "mdns_announce_failed" in caplog.text
