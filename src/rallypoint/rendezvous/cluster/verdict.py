"""The master's cluster-wide verdict on the document its book issued, from every node's report.

Every node reports its own checks (names, connections) of the current generation, and the
generation is verified only when every node passed. The verdict's version moves only on what a
waiting node must act on (a failure appears or goes, the warnings change, the generation is
verified), so N reports wake the N long-polls once. The same reports give the warnings: MTUs
and RDMA devices that differ, clocks off the master's, slow and lossy links.
"""

from __future__ import annotations

import asyncio

import msgspec

from rallypoint import wire
from rallypoint.core import links
from rallypoint.core.clock import CLOCK_WARN_S, warning
from rallypoint.errors import JoinRejected
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.reasons import Reason
from rallypoint.rendezvous.waits import wait_until

#: Failure codes a busy window excuses: the job already listens on that port (see excused).
_WINDOW_CODES = {
    "master_port_unreachable": "master",
    "jax_port_unreachable": "jax",
    "tf_port_unreachable": "tf",
}


#: Link warnings a verdict lists; the rest are counted (the master's /status has them all).
LINK_WARNINGS_SHOWN = 8


def stale_generation(generation: str, doc: ClusterDoc | None) -> JoinRejected:
    """The refusal of a report for another generation than ``doc``'s (master or relay)."""
    return JoinRejected(
        409,
        "stale_generation",
        f"report for generation {generation}, but the current one is "
        f"{None if doc is None else doc.generation}; fetch the new cluster document",
    )


class ClusterVerdict:
    """The verdict on the book's current document: each rank's latest report, what follows."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        #: The document judged: the book's current one (start).
        self._doc: ClusterDoc | None = None
        #: The latest report of each rank on the current document.
        self.reports: dict[int, wire.Report] = {}
        self._unpassed: set[int] = set(range(spec.nnodes))
        self._failing: set[int] = set()
        self._mtus: dict[int, int] = {}  # MTU -> how many nodes report it
        # Rank -> its clock warning, for the nodes CLOCK_WARN_S or more off (_track_clock).
        self._skewed: dict[int, str] = {}
        #: Slow and lossy links of the current generation, once every node reported.
        self.link_warnings: list[Reason] = []
        #: The verdict as it stands; None until the book issues its first document.
        self.current: wire.Verdict | None = None
        self._version = 0
        self._changed = asyncio.Event()
        self._closed = False

    def start(self, doc: ClusterDoc) -> None:
        """Judge ``doc`` from now on (the book issued it): the reports on the last one are void."""
        self._doc = doc
        self.reports = {}
        self._unpassed = set(range(self.spec.nnodes))
        self._failing = set()
        self._mtus = {}
        self._skewed = {}
        self.link_warnings = []
        self._rebuild(force=True)

    def close(self) -> None:
        """From now on a long-poll answers as soon as it checks: the master is going away."""
        self._closed = True

    def report(self, report: wire.Report) -> wire.Verdict:
        """Record a node's checks of the current generation; the verdict as it stands now."""
        self._check(report)
        old = self.reports.get(report.rank)
        self.reports[report.rank] = report
        material = self._count(old, report)
        # Verified can only flip once every rank reported and nobody else still checks.
        complete = len(self.reports) == self.spec.nnodes and self._unpassed <= self._failing
        if material or complete:
            self._rebuild()
        elif self.current is not None and (old is None or old.passed != report.passed):
            # Who is still checking is shown, not acted on: refresh it without a new version
            # (which would wake every long-poll), listing names once few are left.
            verdict = self.current
            few = len(self._unpassed) <= wire.MAX_PENDING
            self.current = msgspec.structs.replace(
                verdict,
                pending=self._pending() if few else verdict.pending,
                pending_count=len(self._unpassed),
            )
        assert self.current is not None
        return self.current

    async def wait(self, generation: str, seen: int, timeout_s: float) -> wire.Verdict:
        """The verdict once its version is not ``seen`` (or the generation moved on)."""

        def moved() -> bool:
            verdict = self.current
            return (
                verdict is None
                or verdict.version != seen
                or verdict.generation != generation
                or self._closed
            )

        await wait_until(moved, lambda: self._changed, timeout_s)
        assert self.current is not None
        return self.current

    def warnings(self) -> tuple[str, ...]:
        """The current verdict's warnings (none before the first report)."""
        return () if self.current is None else self.current.warnings

    def _check(self, report: wire.Report) -> None:
        """Refuse a report from another session, for another node's rank, or on another
        document than the current one."""
        spec, doc = self.spec, self._doc
        if report.session != spec.session:
            raise JoinRejected(
                409, "session_mismatch", f"report for session {report.session!r}, not ours"
            )
        if (
            not 0 <= report.rank < spec.nnodes
            or report.host.lower() != spec.hosts[report.rank].lower()
        ):
            raise JoinRejected(
                403, "impostor", f"host {report.host!r} cannot report for rank {report.rank}"
            )
        if doc is None or report.generation != doc.generation:
            raise stale_generation(report.generation, doc)

    def _count(self, old: wire.Report | None, report: wire.Report) -> bool:
        """Count ``report`` in, replacing its rank's ``old`` one; True when it moved something
        a waiting node acts on (failures, busy windows, links, MTUs, RDMA, clocks)."""
        rank = report.rank
        if report.passed:
            self._unpassed.discard(rank)
        else:
            self._unpassed.add(rank)
        if report.failures:
            self._failing.add(rank)
        else:
            self._failing.discard(rank)
        before = old or wire.Report(self.spec.session, report.generation, rank, report.host, False)
        # Both trackers keep counts: each must see every report, whatever the others say.
        mtus_moved = self._count_mtu(before.net.mtu, report.net.mtu)
        clock_moved = self._track_clock(report)
        return (
            mtus_moved
            or clock_moved
            or before.failures != report.failures
            or before.busy != report.busy
            or before.links != report.links
            or before.net.rdma != report.net.rdma
        )

    def _rebuild(self, *, force: bool = False) -> None:
        """Recompute the verdict; bump its version and wake waiters when it changed."""
        doc = self._doc
        if doc is None:
            return
        failures = [
            self._as_seen_by_all(rank, reason)
            for rank in sorted(self._failing)
            for reason in self.reports[rank].failures
            if not self.excused(reason)
        ]
        blocked = self._blocked()
        verified = not blocked and not failures
        warnings = self._warnings()
        old = self.current
        if (
            not force
            and old is not None
            and old.verified == verified
            and old.failures == tuple(failures[: wire.MAX_FAILURES])
            and old.failure_count == len(failures)
            and old.warnings == warnings
        ):
            return
        pending = sorted(blocked)
        self._version += 1
        self.current = wire.Verdict(
            session=self.spec.session,
            generation=doc.generation,
            version=self._version,
            verified=verified,
            pending=tuple(pending[: wire.MAX_PENDING]),
            pending_count=len(pending),
            failures=tuple(failures[: wire.MAX_FAILURES]),
            failure_count=len(failures),
            warnings=warnings[: wire.MAX_FAILURES],
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _warnings(self) -> tuple[str, ...]:
        """The verdict's warnings: MTUs and clocks; once every node reported, also the links
        (judged then, into link_warnings) and RDMA devices."""
        warnings = self._mtu_warnings() + self._clock_warnings()
        if len(self.reports) != self.spec.nnodes:
            return warnings
        # Judged once every node reported: links are compared with the cluster's best,
        # and judging at every report of a 4096-node herd would cost O(N^2).
        self.link_warnings = self._judge_links()
        warnings += tuple(r.message for r in self.link_warnings[:LINK_WARNINGS_SHOWN])
        if len(self.link_warnings) > LINK_WARNINGS_SHOWN:
            more = len(self.link_warnings) - LINK_WARNINGS_SHOWN
            warnings += (f"{more} more slow or lossy links: see the master's /status",)
        return warnings + self._rdma_warnings()

    def _blocked(self) -> set[int]:
        """Ranks that keep the generation from being verified (O(ranks not passed))."""
        return {
            rank
            for rank in self._unpassed
            if rank not in self.reports
            or not self.reports[rank].failures
            or any(not self.excused(r) for r in self.reports[rank].failures)
        }

    def _pending(self) -> tuple[int, ...]:
        return tuple(sorted(self._blocked())[: wire.MAX_PENDING])

    def _count_mtu(self, old: int | None, new: int | None) -> bool:
        """Move one node's MTU from ``old`` to ``new``; True when the set of MTUs changed."""
        if old == new:
            return False
        kinds = len(self._mtus)
        if old is not None:
            self._mtus[old] -= 1
            if not self._mtus[old]:
                del self._mtus[old]
        if new is not None:
            self._mtus[new] = self._mtus.get(new, 0) + 1
        return len(self._mtus) != kinds or (len(self._mtus) > 1)

    def excused(self, reason: Reason) -> bool:
        """A probe of a master or TF port answered by something else, where the port's node
        reported that the job itself already listens there (its window was busy)."""
        kind = _WINDOW_CODES.get(reason.code)
        if kind is None or reason.detail != "foreign_answer" or len(reason.ranks) != 2:
            return False
        target = self.reports.get(reason.ranks[1])
        return target is not None and kind in target.busy

    def _as_seen_by_all(self, rank: int, reason: Reason) -> Reason:
        """A node's failure as every other node shows it: prefixed with the reporter's name."""
        host = self.spec.hosts[rank]
        message = reason.message
        if not message.startswith(host + " "):
            message = f"{host} reports: {message}"
        ranks = reason.ranks or (rank,)
        return Reason(reason.code, message[:1000], reason.host, reason.detail, ranks)

    def _judge_links(self) -> list[Reason]:
        measured = {rank: report.links for rank, report in self.reports.items() if report.links}
        return links.judge(measured, self.spec.hosts)

    def link_view(self, limit: int = 512) -> list[dict[str, object]]:
        """Every measured link of the current generation (the first ``limit``), for /status."""
        hosts = self.spec.hosts
        # A warning names a link (two ranks) or a node (one): a link shows both kinds.
        flagged: dict[frozenset[int], set[str]] = {}
        for reason in self.link_warnings:
            flagged.setdefault(frozenset(reason.ranks), set()).add(reason.code)
        none: set[str] = set()
        out: list[dict[str, object]] = []
        for rank, report in sorted(self.reports.items()):
            for link in report.links:
                if link.peer >= len(hosts):
                    continue
                if len(out) == limit:
                    return out
                codes = (
                    flagged.get(frozenset((rank, link.peer)), none)
                    | flagged.get(frozenset((rank,)), none)
                    | flagged.get(frozenset((link.peer,)), none)
                )
                out.append(
                    {
                        "from": hosts[rank],
                        "to": hosts[link.peer],
                        **msgspec.structs.asdict(link),
                        "warnings": sorted(codes),
                    }
                )
        return out

    def _rdma_warnings(self) -> tuple[str, ...]:
        """Nodes that differ in whether they see RDMA devices (NCCL then mixes IB and TCP)."""
        ordered = [report for _, report in sorted(self.reports.items())]
        with_rdma = [r.host for r in ordered if r.net.rdma]
        without = [r.host for r in ordered if not r.net.rdma]
        if not with_rdma or not without:
            return ()
        return (
            f"RDMA devices are visible on {_listed(with_rdma)} but not on {_listed(without)}: NCCL "
            "would mix InfiniBand and sockets across the cluster; give every node the same "
            "devices, or set NCCL_IB_DISABLE=1 on every node",
        )

    def _mtu_warnings(self) -> tuple[str, ...]:
        if len(self._mtus) < 2:
            return ()
        by_mtu: dict[int, list[str]] = {}
        for _rank, report in sorted(self.reports.items()):
            if report.net.mtu is not None:
                by_mtu.setdefault(report.net.mtu, []).append(
                    f"{report.host} ({report.net.ifname or '?'})"
                )
        if len(by_mtu) < 2:
            return ()
        parts = []
        for mtu, hosts in sorted(by_mtu.items()):
            parts.append(f"{mtu} on {_listed(hosts)}")
        return (
            "the MTU of the interface that routes to the master differs across the cluster: "
            + "; ".join(parts)
            + "; large messages may stall where paths disagree: give every node the same MTU",
        )

    def _track_clock(self, report: wire.Report) -> bool:
        """Note a node's clock as its report gives it; True when its warning changed (O(1))."""
        facts = report.clock
        if facts is None or abs(facts.offset_s) < CLOCK_WARN_S:
            return self._skewed.pop(report.rank, None) is not None
        text = warning(report.host, facts)
        old = self._skewed.get(report.rank)
        # The round trip changes with every sample: only a move of the offset itself (at the
        # warning's 0.1 s precision) is worth a new verdict version.
        if old is not None and old.split(" (", 1)[0] == text.split(" (", 1)[0]:
            return False
        self._skewed[report.rank] = text
        return True

    def _clock_warnings(self) -> tuple[str, ...]:
        """One warning per node whose clock is CLOCK_WARN_S or more off the master's (a few
        named, the rest counted)."""
        if not self._skewed:
            return ()
        ranks = sorted(self._skewed)
        out = [self._skewed[rank] for rank in ranks[:4]]
        if len(ranks) > 4:
            out.append(
                f"{len(ranks) - 4} more nodes' clocks are {CLOCK_WARN_S:g} s or more off the "
                "master's: the master's /status lists each node's offset under cluster"
            )
        return tuple(out)


def _listed(hosts: list[str], shown: int = 4) -> str:
    """The first ``shown`` hosts, and how many more there are."""
    more = f" and {len(hosts) - shown} more" if len(hosts) > shown else ""
    return ", ".join(hosts[:shown]) + more
