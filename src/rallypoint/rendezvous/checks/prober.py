"""The prober: runs one document's connection targets until all pass (connectivity.py).

Probes run concurrently (at most ``probe_workers`` at once), each bounded by
``probe_timeout_s``; failing ones are retried with capped, jittered backoff until they pass,
so a fault repaired while the cluster waits turns it ready without a restart. On the probe
port data crosses both ways (net/datapath.py); a stall is searched for the packet size that
does pass (``path_mtu``), and the links of links.measured_peers are measured.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Mapping, Sequence

import msgspec

from rallypoint.auth import Authenticator
from rallypoint.core import links
from rallypoint.core.backoff import Backoff
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.net import datapath, probe
from rallypoint.net.pause import Pause
from rallypoint.reasons import (
    Reason,
    path_mtu_reason,
    slow_link_failure,
    stalled_reason,
    unreachable_reason,
)
from rallypoint.settings import Settings

log = logging.getLogger("rallypoint.rendezvous")

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
#: Bytes per second in one Mbit/s: the metrics are in base units.
MBPS_BYTES = 1e6 / 8


class Target(msgspec.Struct, frozen=True):
    """One connection to try: a peer's port of one kind at the address its name gave here."""

    kind: str  # "master", "tf" or "probe"
    rank: int
    host: str
    address: str
    port: int


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
        settings = self.settings
        backoff = Pause(
            Backoff(
                settings.backoff_initial_s, settings.backoff_max_s, jitter="half", rng=self._rng
            )
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
        metrics.link_throughput.labels(host, "up").set(link.up_mbps * MBPS_BYTES)
        metrics.link_throughput.labels(host, "down").set(link.down_mbps * MBPS_BYTES)
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
        ).rounded()
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
