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

Probes run concurrently (at most ``probe_workers`` at once), each bounded by
``probe_timeout_s``; failing ones are retried with capped, jittered backoff until they pass,
so a fault repaired while the cluster waits turns it ready without a restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence

import msgspec

from rallypoint.auth import Authenticator
from rallypoint.core import links, names
from rallypoint.core.backoff import Backoff
from rallypoint.errors import PortError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.net import datapath, probe
from rallypoint.net.ports import HeldPort
from rallypoint.reasons import (
    Reason,
    path_mtu_reason,
    slow_link_failure,
    stalled_reason,
    unreachable_reason,
)
from rallypoint.settings import Settings

#: A measured link's transfer is repeated (up to MEASURES in all) while the ones so far took
#: less than this: the best of each leg is kept, since a busy CPU only ever slows a leg down
#: (docs/readiness.md, "Data path"); a slow link is not measured twice.
REMEASURE_WITHIN_S = 0.25
MEASURES = 3

#: Bytes each way of one try in the search for the packet size that passes.
SEARCH_BYTES = 16 * 1024
#: The smallest packets every path must carry: IPv4's 576 (RFC 791), IPv6's 1280 (RFC 8200).
MIN_PACKET = {4: 576, 6: 1280}
#: IP and TCP headers below the MSS (options are counted in the MSS).
HEADERS = {4: 40, 6: 60}

log = logging.getLogger("rallypoint.rendezvous")

#: Window kinds, by the name of the held port they open on.
WINDOW_KINDS = ("master", "jax", "tf", "probe")


class Target(msgspec.Struct, frozen=True):
    """One connection to try: a peer's port of one kind at the address its name gave here."""

    kind: str  # "master", "tf" or "probe"
    rank: int
    host: str
    address: str
    port: int


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


class Windows:
    """Listening windows on this node's held ports, all answered by one probe listener.

    A window that cannot open because something already listens on the port (the job's
    own TCPStore or TF server, after a generation change) is *busy*: peers then see a
    foreign answer there, which the master excuses for that port (ClusterVerdict.excused).
    """

    def __init__(self, held: Mapping[str, HeldPort], listener: probe.ProbeListener) -> None:
        self.held = held
        self.listener = listener
        self.busy: frozenset[str] = frozenset()
        self.state: dict[str, str] = {kind: "closed" for kind in held if kind in WINDOW_KINDS}
        self._open = False

    async def open(self) -> None:
        """Open every window that is not open yet; idempotent."""
        if self._open:
            return
        self._open = True
        busy = set()
        for kind, held in self.held.items():
            if kind not in WINDOW_KINDS:
                continue
            try:
                sockets = held.listen()
            except PortError as exc:
                log.info("window_busy", extra={"kind": kind, "port": held.port, "error": str(exc)})
                busy.add(kind)
                self.state[kind] = "busy"
                continue
            await self.listener.serve(sockets)
            self.state[kind] = "open"
        self.busy = frozenset(busy)

    async def close(self) -> None:
        """Close every window (the holds stay); idempotent."""
        if not self._open:
            return
        self._open = False
        await self.listener.close()
        self.state = dict.fromkeys(self.state, "closed")
        self.busy = frozenset()


class Prober:
    """Runs one document's targets until all pass, reporting the failing set as it changes."""

    def __init__(
        self,
        spec: ClusterSpec,
        settings: Settings,
        *,
        auth: Authenticator,
        metrics: Metrics,
        route: probe.ProbeRoute,
        rng: random.Random,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.auth = auth
        self.metrics = metrics
        self.route = route
        self._rng = rng
        self._slots = asyncio.Semaphore(settings.probe_workers)
        #: The links measured in the current run, by peer rank (links.measured_peers).
        self.links: dict[int, links.LinkStat] = {}
        self._measure = frozenset(
            links.measured_peers(spec.nnodes, spec.rank) if settings.throughput else ()
        )

    def start(self, target: Target) -> asyncio.Task[probe.Outcome]:
        """Probe one target now, ahead of run() (its name passed before the others')."""
        return asyncio.ensure_future(self._one(target))

    async def run(
        self,
        targets: Sequence[Target],
        on_change: Callable[[list[Reason]], None],
        started: Mapping[Target, asyncio.Task[probe.Outcome]] | None = None,
    ) -> None:
        """Probe every target; retry the failing ones until none fails (or cancelled).

        The first round takes the outcome of a probe already ``started`` for a target.
        """
        self.links = {}
        failing = await self._round(targets, started)
        on_change(list(failing.values()))
        # Half jitter: a floor of half the ceiling keeps retries of a failing port spaced out.
        backoff = Backoff(
            self.settings.backoff_initial_s,
            self.settings.backoff_max_s,
            jitter="half",
            rng=self._rng,
        )
        while failing:
            await backoff.sleep()
            retried = await self._round(list(failing))
            if retried != failing:
                on_change(list(retried.values()))
            failing = retried

    async def _round(
        self,
        targets: Sequence[Target],
        started: Mapping[Target, asyncio.Task[probe.Outcome]] | None = None,
    ) -> dict[Target, Reason]:
        early = started or {}
        outcomes = await asyncio.gather(*(early.get(t) or self._one(t) for t in targets))
        failing: dict[Target, Reason] = {}
        for target, outcome in zip(targets, outcomes, strict=True):
            reason = self._judge(target, outcome)
            if reason is not None:
                failing[target] = reason
        return failing

    def _judge(self, t: Target, outcome: probe.Outcome) -> Reason | None:
        """The failure an outcome stands for (None: passed); records a measured link."""
        source, target = (self.spec.rank, self.spec.host), (t.rank, t.host, t.address)
        if outcome.cause == "path_mtu":
            mtu = None if outcome.transfer is None else outcome.transfer.route_mtu
            return path_mtu_reason(source, target, int(outcome.detail), mtu)
        if outcome.cause == "stalled":
            return stalled_reason(source, target, t.port, outcome.detail)
        if not outcome.ok:
            return unreachable_reason(source, target, t.kind, t.port, outcome.cause, outcome.detail)
        link = outcome.link
        if link is None:
            return None
        self.links[t.rank] = link
        self._export(t.host, link)
        floor = self.settings.min_link_mbps
        slowest = min(link.up_mbps, link.down_mbps)
        if floor is not None and slowest < floor:
            return slow_link_failure(source, (t.rank, t.host), slowest, floor)
        return None

    def _export(self, host: str, link: links.LinkStat) -> None:
        metrics = self.metrics
        metrics.link_mbps.labels(host, "up").set(link.up_mbps)
        metrics.link_mbps.labels(host, "down").set(link.down_mbps)
        for direction, share in (("up", link.up_retrans), ("down", link.down_retrans)):
            if share is not None:
                metrics.link_retrans.labels(host, direction).set(share)
        if link.rtt_ms is not None:
            metrics.link_rtt.labels(host).set(link.rtt_ms / 1000)

    def _measures(self, target: Target) -> bool:
        """Whether ``target`` is a link this node measures (links.measured_peers)."""
        return target.kind == "probe" and target.rank in self._measure

    def _data(self, target: Target) -> datapath.DataRequest | None:
        """What the probe of ``target`` moves: nothing on ports other than the probe port."""
        if target.kind != "probe":
            return None
        size = self.settings.throughput_bytes if self._measures(target) else datapath.PATH_BYTES
        return datapath.DataRequest(
            up=size,
            down=size,
            stall_s=self.settings.probe_timeout_s,
            budget_s=self.settings.throughput_budget_s,
        )

    async def _probe(self, target: Target, data: datapath.DataRequest | None) -> probe.Outcome:
        address, port = self.route(target.host, target.address, target.port)
        async with self._slots:
            outcome = await probe.probe(
                address,
                port,
                session=self.spec.session,
                auth=self.auth,
                rank=target.rank,
                host=target.host,
                timeout_s=self.settings.probe_timeout_s,
                data=data,
            )
        if outcome.transfer is not None:
            self.metrics.probe_bytes.labels("sent").inc(outcome.transfer.up_bytes)
            self.metrics.probe_bytes.labels("received").inc(outcome.transfer.down_bytes)
        return outcome

    async def _search(self, target: Target, low: int, high: int) -> int | None:
        """The largest packet in [low, high] that crosses to ``target`` and back, or None."""
        family = 6 if ":" in target.address else 4
        stall_s = min(self.settings.probe_timeout_s, 1.0)

        async def passes(size: int) -> bool:
            request = datapath.DataRequest(
                up=SEARCH_BYTES,
                down=SEARCH_BYTES,
                stall_s=stall_s,
                budget_s=max(stall_s * 2, 1.0),
                mss=size - HEADERS[family],
            )
            outcome = await self._probe(target, request)
            return outcome.ok and outcome.transfer is not None and outcome.transfer.complete

        return await datapath.largest_passing(low, high, passes)

    async def _measured(self, target: Target, first: probe.Outcome) -> probe.Outcome:
        """``first`` with its link's figures: the best legs of up to MEASURES transfers."""
        transfers = [first.transfer] if first.transfer is not None else []
        spent = first.elapsed_s
        while (
            len(transfers) < MEASURES
            and spent < REMEASURE_WITHIN_S
            and all(t.complete for t in transfers)
        ):
            again = await self._probe(target, self._data(target))
            spent += again.elapsed_s
            if not again.ok or again.transfer is None:
                break
            transfers.append(again.transfer)
        if not transfers:
            return first
        best_up = max(transfers, key=lambda t: t.up_mbps)
        best_down = max(transfers, key=lambda t: t.down_mbps)
        rtts = [t.rtt_us for t in transfers if t.rtt_us is not None]
        link = links.LinkStat(
            peer=target.rank,
            up_mbps=best_up.up_mbps,
            down_mbps=best_down.down_mbps,
            up_retrans=_share([(t.up_retrans_bytes, t.up_sent) for t in transfers]),
            down_retrans=_share([(t.peer_retrans, t.peer_sent) for t in transfers]),
            rtt_ms=min(rtts) / 1000 if rtts else None,
            bytes=min(best_up.up_bytes, best_down.down_bytes),
            complete=all(t.complete for t in transfers),
        )
        return msgspec.structs.replace(first, link=link)

    async def _one(self, target: Target) -> probe.Outcome:
        outcome = await self._probe(target, self._data(target))
        if outcome.ok and self._measures(target):
            outcome = await self._measured(target, outcome)
        if outcome.cause == "stalled" and outcome.transfer is not None:
            # Connected and answered, then data stopped: find the packet size that passes,
            # up to the MTU of the route this very connection took.
            family = 6 if ":" in target.address else 4
            low = MIN_PACKET[family]
            route = max(outcome.transfer.route_mtu or 1500, low)
            top = min(route, datapath.MAX_MSS + HEADERS[family])
            size = await self._search(target, low, top)
            if size is not None and size < top:
                outcome = probe.Outcome("path_mtu", str(size), outcome.elapsed_s, outcome.transfer)
        self.metrics.probes_sent.labels(target.kind, outcome.cause).inc()
        if not outcome.ok:
            log.debug(
                "probe_failed",
                extra={
                    "kind": target.kind,
                    "host": target.host,
                    "address": target.address,
                    "port": target.port,
                    "cause": outcome.cause,
                },
            )
        return outcome


def _share(parts: Sequence[tuple[int | None, int | None]]) -> float | None:
    """Retransmitted over sent bytes, summed over transfers (None: the kernel did not say)."""
    if any(lost is None or sent is None for lost, sent in parts):
        return None
    sent = sum(s or 0 for _, s in parts)
    return sum(lost or 0 for lost, _ in parts) / sent if sent else 0.0


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
