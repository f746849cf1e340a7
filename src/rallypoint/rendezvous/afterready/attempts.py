"""Which attempt this node's `run` belongs to, and when it may start (docs/run.md).

A `run` about to start its child reports *starting*. It is numbered for the attempt after
the last one the cluster started (``book.go``), but only once this node has heard the
cluster's count since it booted (a worker: one answer from its upstream; the master: a
keep-alive from every node, or the liveness bound), so that a restarted sidecar never
numbers a run into an attempt already under way. The master starts an attempt when every
node is starting for it (JobBook.advance) and the cluster is verified (the master is ready:
every node passed the checks of the current generation, so a node that came back with a new
address was checked again like any node); a run may start its child when the attempt it is
numbered for is the one the cluster started and its own sidecar is ready (the env it then
reads is the current generation's).

A new run that finds this node's last run still in the attempt the cluster started knows
that run vanished (SIGKILLed, its container restarted) and its child with it: this node is
lost in that attempt, and the new run is numbered only once the upstream's answer shows the
failure reached it (or a later attempt began), so that the others stop that attempt rather
than wait on a peer that is gone.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from rallypoint.core.jobs import JobBook, JobState, JobStatus
from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterSpec
from rallypoint.wire.jobstates import Report

#: of_report's answer for a run that gave up before it was numbered: nothing to take.
WITHDRAWN = -2
#: A run's states while its child may be alive in the attempt it was numbered for.
ACTIVE = (JobStatus.STARTING, JobStatus.RUNNING, JobStatus.TERMINATED)
#: Why a node whose run vanished is lost (Attempts.vanished).
RUN_VANISHED = "its run ended without a report (killed, or its container restarted)"


class Attempts:
    """This node's side of the attempt count: its run's number and its start."""

    def __init__(
        self,
        spec: ClusterSpec,
        book: JobBook,
        *,
        coordinated: bool,
        sync_bound_s: float,
        ready: Callable[[], bool] = lambda: True,
    ) -> None:
        self.spec = spec
        self.book = book
        #: Whether this node is ready (on the master: the cluster passed its checks).
        self.ready = ready
        #: Whether the nodes carry job states to each other (off: --keepalive 0); without,
        #: each run starts at once.
        self.coordinated = coordinated
        #: A starting report not numbered yet (this node has not heard the cluster's count).
        self.unnumbered: JobState | None = None
        #: A worker: whether its upstream answered since this sidecar booted.
        self.upstream_heard = False
        #: The master: the nodes heard since boot, and when it stops waiting for the rest.
        self.heard: set[int] = set()
        self._sync_deadline = time.monotonic() + sync_bound_s
        self._sync_bound_s = sync_bound_s
        #: A vanished run's attempt, and until when numbering waits for the upstream to
        #: know of it (a worker).
        self._vanished: tuple[int, float] | None = None

    def synced(self) -> bool:
        """Whether this node has heard the cluster's attempt count since it booted."""
        spec = self.spec
        if not self.coordinated or spec.nnodes == 1:
            return True
        if spec.is_master:
            return len(self.heard) >= spec.nnodes - 1 or time.monotonic() >= self._sync_deadline
        return self.upstream_heard

    def own(self) -> JobState:
        """This node's job as its run last said it (a starting report not numbered yet too)."""
        return self.unnumbered or self.book.state(self.spec.rank)

    def of_report(self, report: Report) -> int:
        """The attempt a report belongs to: -1 for a starting run (numbered later); for a run
        that gives up waiting, the attempt it was numbered for (WITHDRAWN: none yet); for any
        other, the attempt `run` was told to start, which must have been started (a report
        that names none belongs to the attempt started last). PeerMessageError otherwise."""
        book = self.book
        if report.state == JobStatus.STARTING:
            return -1
        own = self.own()
        if (
            report.state == JobStatus.STOPPED
            and own.state == JobStatus.STARTING
            and own.started == round(report.started, 3)
        ):
            # The run gives up waiting to start (its --timeout or --rejoin-timeout, a stop
            # from outside): withdrawn from the attempt it was numbered for, which must not
            # count it as starting, nor a later run on this node take it for one that vanished.
            if self.unnumbered is not None:
                self.unnumbered = None
                return WITHDRAWN
            return own.attempt
        if report.attempt is None:
            return max(book.go, 0)
        # A restarted sidecar learns the count back from the others (or, alone, from `run`'s
        # report): it refuses only what it knows was never started.
        known = self.synced() and book.go >= 0
        if known and report.attempt > book.go and report.attempt != self.start():
            raise PeerMessageError(
                f"job report: attempt {report.attempt} was never started (the cluster's last "
                f"is {book.go}); report the attempt GET /job said to start"
            )
        return report.attempt

    def vanished(self, started: float, now: float) -> JobState | None:
        """For a starting report of a run started at ``started``: this node lost in the
        attempt its last run is still in, when that is the one the cluster started and the
        run is another (the same run asks again after a sidecar restart); else None."""
        spec, book = self.spec, self.book
        known = book.state(spec.rank)
        if known.state not in ACTIVE or known.attempt != book.go or known.started == started:
            return None
        if not spec.is_master:
            self._vanished = (known.attempt, time.monotonic() + self._sync_bound_s)
        return JobState(spec.rank, spec.host, JobStatus.LOST, known.started, now,
                        detail=RUN_VANISHED, attempt=known.attempt)  # fmt: skip

    def heard_upstream(self, go: int, first: JobState | None) -> None:
        """The upstream's answer: the count it has and its first failure."""
        held = self._vanished
        if held is not None and (go > held[0] or (first is not None and first.attempt == held[0])):
            self._vanished = None

    def numbered(self, now: float) -> JobState | None:
        """The starting state to take now, numbered for the next attempt; None when there is
        none to take (not starting, not synced yet, or numbered already and current).

        A starting state whose attempt the cluster started without it (a stale count) is
        numbered again for the next one: a run never joins an attempt under way.
        """
        own = self.own()
        if own.state != JobStatus.STARTING or not self.synced():
            return None
        if self._vanished is not None and time.monotonic() < self._vanished[1]:
            return None  # the upstream does not know yet that the last run vanished
        if self.unnumbered is None and own.attempt >= self.book.go:
            return None
        self.unnumbered = None
        return msgspec.structs.replace(own, attempt=self.book.go + 1, since=round(now, 3))

    def start(self) -> int | None:
        """The attempt this node's run may start its child for now, if any."""
        own = self.book.state(self.spec.rank)
        if self.unnumbered is not None or own.state != JobStatus.STARTING or not self.ready():
            return None
        if not self.coordinated:
            return own.attempt
        return own.attempt if own.attempt == self.book.go else None
