"""The cluster-wide verdict, seen from one node: report this node's checks, follow the master's.

A node's own checks passing is not enough: a trainer that starts while another node is cut
off hangs in its first collective. So every node reports its checks of a generation to the
master (POST /v1/report, or the master's own book in-process), and turns ready only once the
master's verdict says every node passed. Until then it shows its own failures first, then the
other nodes' (each names its pair), then who is still checking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Sequence
from typing import Protocol

import msgspec

from rallypoint import wire
from rallypoint.core.backoff import Backoff
from rallypoint.core.clock import ClockFacts
from rallypoint.core.links import LinkStat
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.net.pause import Pause
from rallypoint.net.peerhttp import PeerClient
from rallypoint.reasons import Reason
from rallypoint.rendezvous.cluster.masterbook import Transport
from rallypoint.rendezvous.tasks import unless_set
from rallypoint.settings import Settings

log = logging.getLogger("rallypoint.rendezvous")


class Shown(Protocol):
    """Where the check shows why the node is not ready (its Readiness)."""

    def not_ready(self, *reasons: Reason) -> None: ...


def http_transport(
    client: PeerClient,
    target: Callable[[], tuple[str, int] | None],
    facts: Callable[[], ClockFacts | None],
) -> Transport:
    """A worker reports to the master's peer API at the address it last joined through, each
    report with this node's clock facts as they are then (core/clock.py)."""

    async def send(report: wire.Report) -> wire.Verdict:
        where = target()
        if where is None:
            raise PeerDown("the master's peer API address is not known yet")
        report = msgspec.structs.replace(report, clock=facts())
        return await client.post_report(where, wire.encode_report(report))

    return send


class GenerationCheck:
    """One generation's checks on this node and the master's verdict on all of them."""

    def __init__(
        self,
        node: Shown,
        spec: ClusterSpec,
        doc: ClusterDoc,
        settings: Settings,
        transport: Transport,
        *,
        net: wire.NetFacts,
        busy: Callable[[], frozenset[str]],
        rng: random.Random,
        announce: Callable[[], None],
    ) -> None:
        self.node = node
        self.spec = spec
        self.doc = doc
        self.settings = settings
        self._transport = transport
        self.net = net
        self._busy = busy
        self._rng = rng
        self._announce = announce
        self.local: list[Reason] = [
            Reason("verifying", f"checking peer names for generation {doc.generation}")
        ]
        self.passed = False
        #: The links this node measured for this generation (core/links.py), as reported.
        self.links: tuple[LinkStat, ...] = ()
        self.verdict: wire.Verdict | None = None
        self.problem: Reason | None = None
        self._dirty = asyncio.Event()
        #: The local state the master's last verdict answered (for reported()).
        self._answered: object = None
        self._progress = asyncio.Event()  # replaced and set after every answered report

    def update(
        self,
        failures: Sequence[Reason],
        *,
        passed: bool = False,
        links: Sequence[LinkStat] | None = None,
    ) -> None:
        """This node's own checks changed: show it now, and report it when the report changes.

        ``links``: the links measured so far (None: unchanged)."""
        before = self._state()
        self.local = list(failures)
        self.passed = passed and not failures
        if links is not None:
            self.links = tuple(links)
        self._show()
        if self._state() != before:
            self._dirty.set()

    def peer_failed(self, host: str, reason: Reason) -> None:
        """A peer's first name check failed: show and report it now, beside the others'."""
        current = [r for r in self.local if r.code != "verifying" and r.host != host]
        self.update([*current, reason])

    async def failed(self, failures: Sequence[Reason], timeout_s: float) -> None:
        """The names or the env failed: report it (every node shows it), wait for the answer."""
        self.update(failures)
        await self.reported(timeout_s)
        self._announce()

    def trying(self, count: int) -> None:
        """The names passed and the env derived: the connections are being tried."""
        self.update([Reason("verifying", f"trying {count} connections the job will make")])

    def settled(self, failures: Sequence[Reason], links: Sequence[LinkStat] | None = None) -> None:
        """A round of this node's connection checks ended: passed, or what failed.

        A failure is announced (the announce callback: once per generation); a pass only on
        the master, whose announcement also wakes a worker outside its long-poll that missed
        the poke. A worker announces its pass once ready.
        """
        self.update(failures, passed=not failures, links=links)
        if self.spec.is_master or failures:
            self._announce()

    async def reported(self, timeout_s: float) -> None:
        """Wait until the master answered a report of the current local state (or timeout)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while self._dirty.is_set() or self._answered != self._state():
                    await self._progress.wait()

    async def follow(self) -> wire.Verdict:
        """Report until the master's verdict says every node passed; that verdict."""
        # No wake-up event: a report retry waits out its pause.
        backoff = Pause(
            Backoff(self.settings.backoff_initial_s, self.settings.backoff_max_s, rng=self._rng)
        )
        # Nothing to tell the master while the first checks run: it counts a node that has not
        # reported as still checking. The first report carries their outcome.
        while self.verdict is None and not self._failures() and not self.passed:
            await self._dirty.wait()
            self._dirty.clear()
        while True:
            self._dirty.clear()
            seen = -1 if self.verdict is None else self.verdict.version
            state = self._state()
            send = await unless_set(self._transport(self._report(seen)), self._dirty)
            if send.cancelled():
                continue  # our own checks changed: report them at once
            try:
                verdict = send.result()
            except (PeerDown, JoinRejected, AuthError, PeerMessageError) as exc:
                clocked = isinstance(exc, AuthError) and exc.skew_s is not None
                self.problem = Reason(
                    "clock_skew" if clocked else "report_failed",
                    f"cannot report this node's checks to the master {self.spec.master}: {exc}",
                    host=self.spec.master,
                )
                self._show()
                await backoff.sleep()
                continue
            backoff.reset()
            log.debug(
                "verdict_answered", extra={"version": verdict.version, "verified": verdict.verified}
            )
            self.problem = None
            self._answered = state
            progress, self._progress = self._progress, asyncio.Event()
            progress.set()
            if verdict.generation != self.doc.generation:
                await backoff.sleep()  # a new document is on its way to us
                continue
            self.verdict = verdict
            if verdict.verified:
                return verdict
            self._show()

    def reasons(self) -> list[Reason]:
        """Why the node is not ready at this point of the check."""
        own_rank = self.spec.rank
        reasons = list(self.local)
        verdict = self.verdict
        if verdict is not None:
            reasons += [f for f in verdict.failures if not f.ranks or f.ranks[0] != own_rank]
            if verdict.failure_count > len(verdict.failures):
                hidden = verdict.failure_count - len(verdict.failures)
                reasons.append(
                    Reason(
                        "cluster_failed", f"{hidden} more failed checks: see the master's /status"
                    )
                )
            others = [r for r in verdict.pending if r != own_rank]
            if self.passed and others and len(reasons) == 0:
                names = ", ".join(self.spec.hosts[r] for r in others[:8])
                more = verdict.pending_count - min(len(others), 8) - (own_rank in verdict.pending)
                reasons.append(
                    Reason(
                        "cluster_checking",
                        f"this node passed its checks; waiting for {names}"
                        + (f" and {more} more" if more > 0 else "")
                        + " to pass theirs",
                        ranks=tuple(others[:8]),
                    )
                )
        if self.problem is not None:
            reasons.append(self.problem)
        if not reasons:
            reasons.append(
                Reason("cluster_checking", "this node passed its checks; waiting for the verdict")
            )
        return reasons

    def status(self) -> dict[str, object]:
        """This generation's checks for /status."""
        verdict = self.verdict
        return {
            "generation": self.doc.generation,
            "passed": self.passed,
            "local_failures": [r.as_json() for r in self.local if r.code != "verifying"],
            "verdict": None
            if verdict is None
            else {
                "version": verdict.version,
                "verified": verdict.verified,
                "pending": list(verdict.pending),
                "pending_count": verdict.pending_count,
                "failures": [f.as_json() for f in verdict.failures],
                "failure_count": verdict.failure_count,
                "warnings": list(verdict.warnings),
            },
            "report_problem": None if self.problem is None else self.problem.as_json(),
            "links": [
                {"host": self.spec.hosts[link.peer], **msgspec.structs.asdict(link)}
                for link in self.links
                if link.peer < self.spec.nnodes
            ],
        }

    def _show(self) -> None:
        self.node.not_ready(*self.reasons())

    def _failures(self) -> tuple[Reason, ...]:
        """The local failures as reported: each names this node's rank first, within limits."""
        rank = self.spec.rank
        return tuple(
            Reason(
                r.code,
                r.message[:1000],
                r.host,
                None if r.detail is None else r.detail[:1000],
                r.ranks or (rank,),
            )
            for r in self.local[: wire.MAX_FAILURES]
            if r.code != "verifying"
        )

    def _state(self) -> object:
        return (self.passed, self._failures(), self.links)

    def _report(self, seen: int) -> wire.Report:
        rank = self.spec.rank
        failures = self._failures()
        return wire.Report(
            session=self.spec.session,
            generation=self.doc.generation,
            rank=rank,
            host=self.spec.host,
            passed=self.passed,
            failures=failures,
            busy=self._busy(),
            net=self.net,
            seen=seen,
            links=self.links,
        )
