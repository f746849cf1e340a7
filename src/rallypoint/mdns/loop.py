"""The sidecar's mDNS loop: find the cluster when it has no host list, then follow the master."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from rallypoint.errors import ClusterSpecError, PortError
from rallypoint.mdns.ranks import assign_ranks
from rallypoint.reasons import Reason, discovering_reason

if TYPE_CHECKING:
    from rallypoint.mdns.txt import Announcement
    from rallypoint.metrics import Metrics
    from rallypoint.model import ClusterDoc, ClusterSpec
    from rallypoint.net.ports import HeldPort

log = logging.getLogger(__name__)

#: Seconds the mDNS view must stay unchanged before discovered ranks become final.
DISCOVERY_SETTLE_S = 2.0

#: Reserves the ports of a discovered spec (released with the sidecar); PortError if it cannot.
Reserve = Callable[["ClusterSpec"], Mapping[str, "HeldPort"]]


class View(Protocol):
    """What the loop needs of mDNS (an Mdns): this node's host, its peers and announcing."""

    @property
    def host(self) -> str: ...

    def peers(self) -> list[Announcement]: ...

    async def announce(self, *, rank: int, generation: str, addresses: Sequence[str]) -> None: ...


class Documents(Protocol):
    """What the loop reads of the node's verification: the current document's generation."""

    @property
    def generation(self) -> str | None: ...


class Node(Protocol):
    """What the loop needs of the rendezvous: the spec, readiness reasons and a wake-up."""

    @property
    def spec(self) -> ClusterSpec: ...

    @property
    def spec_known(self) -> bool: ...

    @property
    def verification(self) -> Documents | None: ...

    @property
    def addresses(self) -> Sequence[str]: ...

    def adopt(self, spec: ClusterSpec, held: Mapping[str, HeldPort]) -> None: ...

    def discovering(self, reason: Reason) -> None: ...

    def fail(self, reason: Reason) -> None: ...

    def wake(self) -> None: ...


class DiscoveryLoop:
    """Keeps one node's announcement current and acts on what its mDNS view shows.

    `changed` is the event the node's Mdns sets on every change of its view.
    """

    def __init__(
        self,
        mdns: View,
        node: Node,
        changed: asyncio.Event,
        metrics: Metrics,
        *,
        settle_s: float = DISCOVERY_SETTLE_S,
    ) -> None:
        self._mdns = mdns
        self._settle_s = settle_s
        self._node = node
        self._changed = changed
        self._metrics = metrics
        #: The master's last announcement acted on: (instance, generation, addresses).
        self._master_seen: tuple[str, str, tuple[str, ...]] | None = None

    async def run(self, addresses: Sequence[str], reserve: Reserve) -> None:
        """Discover the spec when it has no hosts, then watch the master's announcement."""
        node = self._node
        if not node.spec_known:
            await self.announce(-1, "", addresses)
            spec = await self._discover(node.spec)
            try:
                held = reserve(spec)
            except PortError as exc:
                node.fail(Reason("port_unavailable", str(exc), host=spec.host))
                return
            node.adopt(spec, held)
        await self.announce(node.spec.rank, _generation(node) or "", addresses)
        if node.spec.is_master:
            return
        while True:
            self._changed.clear()
            self._check_master()
            await self._changed.wait()

    async def _discover(self, spec: ClusterSpec) -> ClusterSpec:
        """Wait until mDNS shows exactly NNODES hosts of the session; the spec with their ranks.

        Not-ready reasons say how far it got; more hosts than NNODES is a reason too, kept
        until the extra announcers leave (their goodbye or stale signatures drop them).
        """
        host = self._mdns.host
        while True:
            self._changed.clear()
            peers = self._mdns.peers()
            seen = sorted({a.host for a in peers})
            try:
                hosts = assign_ranks(peers, spec.nnodes)
            except ClusterSpecError as exc:
                hosts = None
                reason = Reason("discovery_conflict", str(exc), detail=f"{len(seen)}/{spec.nnodes}")
            else:
                reason = discovering_reason(spec.nnodes, seen)
            if hosts is not None and host in hosts:
                # Ranks are fixed once assigned, so let the view settle first: a node that
                # committed on the first NNODES hosts it heard could miss an extra announcer
                # (and disagree with a node that heard another subset). Nothing new for
                # DISCOVERY_SETTLE_S, which spans the browser's first repeated query
                # (RFC 6762 section 5.2), and the ranks are final.
                self._node.discovering(reason)
                try:
                    await asyncio.wait_for(self._changed.wait(), self._settle_s)
                except TimeoutError:
                    log.info("mdns_discovered", extra={"hosts": ",".join(hosts)})
                    return msgspec.structs.replace(spec, hosts=hosts, rank=hosts.index(host))
                continue
            self._node.discovering(reason)
            # Signatures expire without an event: look again now and then.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), 1.0)

    def _check_master(self) -> None:
        """mDNS fast path: the master (re)started or changed generation, so re-join at once."""
        node = self._node
        for announcement in self._mdns.peers():
            if announcement.host != node.spec.master:
                continue
            seen = (announcement.instance, announcement.generation, announcement.addresses)
            if seen == self._master_seen:
                return
            self._master_seen = seen
            # An empty generation is a master without a document yet: it just started.
            if announcement.generation and announcement.generation == _generation(node):
                return
            log.info("mdns_master_changed", extra={"generation": announcement.generation or "-"})
            self._metrics.mdns_wakeups.inc()
            node.wake()
            return

    def announce_generation(self, doc: ClusterDoc) -> Coroutine[Any, Any, None]:
        """The announcement of a new generation, with this node's rank and addresses as of now."""
        return self.announce(self._node.spec.rank, doc.generation, self._node.addresses)

    async def announce(self, rank: int, generation: str, addresses: Sequence[str]) -> None:
        """Announce this node; a failure is logged, never raised."""
        try:
            await self._mdns.announce(rank=rank, generation=generation, addresses=addresses)
        except Exception as exc:
            log.warning("mdns_announce_failed", extra={"error": repr(exc)})


def _generation(node: Node) -> str | None:
    """The generation of the node's current cluster document, None before one."""
    return None if node.verification is None else node.verification.generation
