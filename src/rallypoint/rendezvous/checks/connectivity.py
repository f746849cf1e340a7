"""Connectivity checks: try every connection the job will make before the node turns ready.

What is tried, for one cluster document (docs/readiness.md, "Connections"):

* every worker reaches the master port at the address the master's name resolves to on
  that worker, and the master's sidecar answers there (a window on the held port); with
  JAX served, the coordinator port the same way;
* every node reaches each peer in its scope on that peer's probe port, held in the
  ephemeral range where gloo and NCCL listen, so a firewall that opens only the peer API
  port fails the check as it would fail the job;
* with TF_CONFIG served, every node reaches each peer's TF worker port the same way;
* on the probe port, data crosses both ways (net/datapath.py): PATH_BYTES on every pair, so
  that full-size segments must pass (a stall is searched for the packet size that does
  pass: ``path_mtu``), and enough on the links of links.measured_peers to measure their
  throughput, retransmits and RTT.

How, and the retries until a repaired fault passes: rendezvous/checks/prober.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from rallypoint.core import links, names
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.net import probe
from rallypoint.reasons import Reason
from rallypoint.rendezvous.checks.prober import Prober, Target
from rallypoint.rendezvous.tasks import cancel_quietly

if TYPE_CHECKING:
    from rallypoint.rendezvous.peers import PeerTable

log = logging.getLogger("rallypoint.rendezvous")

#: A probe started ahead of the others (its peer's name passed first).
Probing = asyncio.Task[probe.Outcome]


def plan(
    spec: ClusterSpec,
    doc: ClusterDoc,
    ranks: Sequence[int],
    addresses: Mapping[int, str],
    *,
    tf: bool,
    jax: bool = False,
) -> list[Target]:
    """The connections this node tries for ``doc``: peers in ``ranks`` with a known address."""
    targets: list[Target] = []
    for rank in ranks:
        if rank == spec.rank or rank not in addresses:
            continue
        member, address = doc.members[rank], addresses[rank]
        if rank == 0:
            targets.append(Target("master", 0, member.host, address, doc.master_port))
            if jax and member.jax_port is not None:
                targets.append(Target("jax", 0, member.host, address, member.jax_port))
        if member.probe_port is not None:
            targets.append(Target("probe", rank, member.host, address, member.probe_port))
        if tf and member.tf_port is not None:
            targets.append(Target("tf", rank, member.host, address, member.tf_port))
    return targets


def pick_address(resolved: Sequence[str], reported: Sequence[str]) -> str | None:
    """The address a peer's name gives here that the peer also reported, in resolver order.

    gloo, torch's TCPStore and TF's gRPC take the resolver's answers in order, so the first
    one that belongs to the peer is where the job's connection goes.
    """
    for address in resolved:
        if address in reported:
            return address
    return resolved[0] if resolved else None


class Report(Protocol):
    """Where the connections' outcomes go next: the report to the master (clustercheck.py)."""

    def trying(self, count: int) -> None: ...

    def settled(
        self, failures: Sequence[Reason], links: Sequence[links.LinkStat] | None = None
    ) -> None: ...


class Connections:
    """A generation's third step: try the connections the job will make, hand on each round.

    A peer whose name passed is probed at once (``name_passed``), while other names are still
    checked; those outcomes count in the first round of ``start``, once every name passed and
    the env derived: the same targets, since both pick the address from the same resolution.
    """

    def __init__(
        self,
        prober: Prober | None,
        spec: ClusterSpec,
        doc: ClusterDoc,
        *,
        peers: PeerTable,
        frameworks: frozenset[str],
        report: Report,
    ) -> None:
        self.spec = spec
        self.doc = doc
        self._prober = prober
        self._peers = peers
        self._frameworks = frameworks
        self._report = report
        self._early: dict[Target, Probing] = {}
        self._task: asyncio.Task[None] | None = None

    def name_passed(self, rank: int, res: names.Resolution) -> None:
        """A peer's name passed: try its connections now."""
        if self._prober is None:
            return
        address = pick_address(res.addresses, self.doc.members[rank].addresses)
        if address is None:
            return
        for target in self._plan([rank], {rank: address}):
            if target not in self._early:
                self._early[target] = self._prober.start(target)

    def names_again(self) -> None:
        """The names are checked again: drop the probes started on their last check."""
        for task in self._early.values():
            task.cancel()
        self._early.clear()

    def start(self) -> None:
        """Every name passed: try each connection until none fails; no prober, this node passed."""
        prober = self._prober
        if prober is None:
            self._report.settled([])
            return
        ranks = self._peers.in_scope()
        resolutions = {rank: self._peers[rank].resolution for rank in ranks}
        targets = self._plan(ranks, verified_addresses(self.doc, ranks, resolutions))
        self._report.trying(len(targets))

        def probed(failed: list[Reason]) -> None:
            log.debug("probes_done", extra={"failed": len(failed)})
            self._report.settled(failed, list(prober.links.values()))

        self._task = asyncio.create_task(prober.run(targets, probed, started=self._early))

    async def close(self) -> None:
        """Stop every probe of this step; closing twice is safe."""
        self.names_again()
        await cancel_quietly(self._task)

    def _plan(self, ranks: Sequence[int], addresses: Mapping[int, str]) -> list[Target]:
        frameworks = self._frameworks
        return plan(
            self.spec, self.doc, ranks, addresses, tf="tf" in frameworks, jax="jax" in frameworks
        )


def verified_addresses(
    doc: ClusterDoc, ranks: Sequence[int], resolutions: Mapping[int, names.Resolution | None]
) -> dict[int, str]:
    """rank -> the address to probe, for the ranks whose names were checked here."""
    out: dict[int, str] = {}
    for rank in ranks:
        res = resolutions.get(rank)
        if res is None:
            continue
        address = pick_address(res.addresses, doc.members[rank].addresses)
        if address is not None:
            out[rank] = address
    return out
