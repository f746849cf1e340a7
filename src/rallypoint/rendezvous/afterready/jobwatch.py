"""The supervised job, cluster-wide: `run`'s reports in, the keep-alives' job fields both ways.

`rallypoint run` reports its job's start and end to its own sidecar (POST /job). The state
rides the keep-alives that already flow after ready (keepalive.py): a worker's keep-alive
carries its own job, a relay's the states of its group that changed; every answer carries
the first failure, and the job table when the asker's copy is older. Nobody waits for the
next interval: a change on a worker sends a keep-alive at once, and a new first failure (or
the master's own job ending) is pushed down at once, by the master to the ranks that talk
to it, by each relay to its group. A node named lost while its job ran is a failure too
(JobBook.lose). Every local waiter (GET /job?after=) wakes on each change.

Attempts (attempts.py, docs/run.md "Restarting in place"): the master starts one when every
node is starting for it and pushes the count down at once, like a first failure; every
keep-alive and answer carries the sender's count, so a restarted master learns it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable

import msgspec

from rallypoint.core import fanout, jobs
from rallypoint.core.jobs import JobBook, JobState, JobStatus
from rallypoint.core.liveness import Down
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.rendezvous.afterready.attempts import WITHDRAWN, Attempts
from rallypoint.rendezvous.afterready.progresswatch import ProgressWatch
from rallypoint.wire import alive as wirealive
from rallypoint.wire.jobstates import JobView, Report, ShownState

log = logging.getLogger("rallypoint.rendezvous")


class JobWatch:
    """This node's JobBook, what feeds it and who is told of its changes."""

    def __init__(
        self,
        spec: ClusterSpec,
        metrics: Metrics,
        *,
        boot: str,
        group_size: int,
        now: Callable[[], float],
        offset: Callable[[], float] = lambda: 0.0,
        coordinated: bool = True,
        sync_bound_s: float = 15.0,
        ready: Callable[[], bool] = lambda: True,
        unsettled_s: Callable[[], float] = lambda: 0.0,
        progress: ProgressWatch | None = None,
    ) -> None:
        self.spec = spec
        self.book = JobBook(spec.hosts)
        self.boot = boot
        self._metrics = metrics
        self._size = group_size
        #: The master's clock (every stamp is on it), and this node's clock minus it.
        self._now = now
        self._offset = offset
        self._changed = asyncio.Condition()
        #: For the keep-alive loop: send a keep-alive upstream now (a worker's change), and
        #: push the first failure or this node's own end down now.
        self.send_up = asyncio.Event()
        self.send_down = asyncio.Event()
        #: Seconds until every silent watched node is settled (the liveness watch's).
        self.unsettled_s = unsettled_s
        #: The view shows the job's progress, and whether keep-alives carry both.
        self._progress, self._carried = progress, coordinated
        #: Whether this node's `run` reported (a restarted sidecar keeps alive at once).
        self.reported = asyncio.Event()
        #: A relay's members' states as last sent upstream (resent after an upstream restart).
        self._sent: dict[int, tuple[int, float, int, float]] = {}
        self._upstream_boot = "-"
        self._upstream_version = -1
        self._first_pushed: JobState | None = None
        self._own_pushed: JobState | None = None
        #: Exchanges that carried our state on (an upstream's answer, a push done).
        self._delivered = 0
        #: The master's counts by state (a worker's table shows at most MAX_JOBS_SHOWN).
        self._counts: dict[JobStatus, int] = {}
        self.attempts = Attempts(
            spec, self.book, coordinated=coordinated, sync_bound_s=sync_bound_s, ready=ready
        )
        #: Readiness changes seen: a local waiter for an attempt's start wakes on each.
        self._ready_changes = 0
        #: Send the earlier attempts' first failures upstream (it restarted): once.
        self.tell_firsts = False
        self._go_pushed = -1

    # -- what this node's `run` says ----------------------------------------------------

    async def report(self, report: Report, settle_s: float) -> None:
        """Take this node's own report; wait up to ``settle_s`` for it to reach the master."""
        spec = self.spec
        # Every stamp is rounded as the wire rounds it, so that this node's copy of its own
        # state orders against the others' as their copies of it do. The start names the
        # run: kept as `run` stamped it, by this node's own clock. Corrected by the offset,
        # it would change with each new clock sample, and the same run's end could look like
        # an older run's and be dropped. Every other stamp is on the master's clock.
        started = round(report.started, 3)
        attempt = self.attempts.of_report(report)
        if attempt == WITHDRAWN:
            return  # gave up before it was numbered: nothing was counted
        job = JobState(
            spec.rank,
            spec.host,
            JobStatus(report.state),
            started,
            round(self._now() if report.at is None else report.at - self._offset(), 3),
            code=report.code,
            signal=report.signal,
            detail=report.detail if report.state in jobs.EXPLAINED else "",
            attempt=max(attempt, 0),
        )
        self.reported.set()
        log.info(
            "job_reported",
            extra={"state": job.state, "what": jobs.describe(job), "code": job.code},
        )
        delivered = self._delivered
        if attempt < 0:
            await self._run_vanished(started)
            # Starting, not numbered yet: held until this node has heard the cluster's count.
            self.attempts.unnumbered = job
            if not await self._number():
                self.send_up.set()  # a keep-alive brings the count back at once
            return
        if not await self._take([job]):
            return
        if self._pushes_down():
            self.send_down.set()
        if not spec.is_master:
            self.send_up.set()
        if job.state in (JobStatus.RUNNING, JobStatus.STOPPED):
            return  # nothing waits on these: a start, and a stop the others caused
        # `run` hears back once the report went up (or down, on the master): a job that
        # ended 0 is known as done before its sidecar may leave. Bounded by ``settle_s``.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settle_s), self._changed:
                await self._changed.wait_for(lambda: self._delivered > delivered)

    async def _run_vanished(self, started: float) -> None:
        """A new run while the last one is still in the attempt the cluster started: that
        one vanished, and this node is lost in that attempt (Attempts.vanished)."""
        lost = self.attempts.vanished(started, round(self._now(), 3))
        if lost is None:
            return
        log.warning("job_lost", extra={"rank": lost.rank, "host": lost.host, "detail": lost.detail})
        await self._take([lost], mine=True)
        if self._pushes_down():
            self.send_down.set()

    async def _number(self) -> bool:
        """Take this node's starting state once it can be numbered; whether it was."""
        job = self.attempts.numbered(self._now())
        if job is None:
            return False
        log.info("job_starting", extra={"attempt": job.attempt})
        await self._take([job])
        if not self.spec.is_master:
            self.send_up.set()
        return True

    async def wait(self, after: int, timeout_s: float) -> None:
        """Return once the book's version is not ``after`` (a restarted sidecar's is lower),
        or after ``timeout_s``."""
        seen = self._ready_changes
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(
                    lambda: self.book.version != after or self._ready_changes != seen
                )

    async def follow(self, changed: Callable[[], Awaitable[None]]) -> None:
        """On each readiness change: the master starts an attempt that waited for the
        cluster's checks, and every local waiter looks again (an attempt may start here)."""
        while True:
            await changed()
            self._ready_changes += 1
            if not await self._take([]):
                await self._changed_now()

    # -- what the keep-alives carry ----------------------------------------------------

    def outgoing(self, group: Iterable[int]) -> tuple[JobState | None, tuple[JobState, ...], int]:
        """For a keep-alive upstream: our job, our group's changed states, our table's version."""
        own = self.book.state(self.spec.rank)
        changed = []
        for rank in group:
            job = self.book.state(rank)
            if job.state != JobStatus.WAITING and self._sent.get(rank) != job.key:
                changed.append(job)
        own_job = None if own.state == JobStatus.WAITING else own
        return own_job, tuple(changed), self._upstream_version

    def sent(self, jobs_sent: tuple[JobState, ...]) -> None:
        """The upstream took these states."""
        for job in jobs_sent:
            self._sent[job.rank] = job.key

    async def from_upstream(self, answer: wirealive.AliveAnswer) -> None:
        """The upstream's answer: its first failure, its table when ours was older."""
        if answer.boot != self._upstream_boot:
            # A restarted upstream knows nothing of what we sent before: send it again,
            # and the earlier attempts' first failures once.
            self._upstream_boot = answer.boot
            self._sent.clear()
            self.tell_firsts = True
        self.attempts.upstream_heard = True
        self.attempts.heard_upstream(answer.go, answer.first)
        incoming = [] if answer.first is None else [answer.first]
        if answer.jobs is not None:
            incoming += answer.jobs
            self._counts = dict(answer.counts)
        self._upstream_version = answer.jobs_version
        await self._take(incoming, from_upstream=True, go=answer.go)
        await self._number()
        await self._deliver()

    async def from_peer(self, alive: wirealive.Alive, upstream: bool) -> None:
        """A keep-alive: the sender's job, its group's (a relay), the first failure (upstream)."""
        incoming = [] if alive.job is None else [alive.job]
        group = fanout.group(alive.rank, self._size, self.spec.nnodes)
        incoming += [job for job in alive.jobs if job.rank in group]
        if upstream and alive.first is not None:
            incoming.append(alive.first)
        self.attempts.heard.add(alive.rank)
        changed = await self._take(incoming, from_upstream=upstream, go=alive.go)
        if not upstream and any([self.book.recall(job) for job in alive.firsts]):
            changed = True
            await self._changed_now()
        await self._number()
        if changed and not upstream and not self.spec.is_master:
            self.send_up.set()  # a relay passes its group's news on at once

    def with_jobs(self, answer: wirealive.AliveAnswer, seen: int) -> wirealive.AliveAnswer:
        """``answer`` with our job fields, for a keep-alive whose sender holds version ``seen``:
        the table and counts only when that copy is older."""
        book = self.book
        fresh = seen != book.version
        return msgspec.structs.replace(
            answer,
            boot=self.boot,
            go=book.go,
            first=book.first,
            jobs_version=book.version,
            jobs=tuple(book.table(wirealive.MAX_JOBS_SHOWN)) if fresh else None,
            counts=dict(book.counts()) if fresh else {},
        )

    def push_due(self) -> bool:
        """Whether there is news to push down: a new first failure, or our own job's end."""
        own = self.book.state(self.spec.rank)
        ended = own.state in jobs.ENDED
        return (
            self.book.first != self._first_pushed
            or (ended and own != self._own_pushed)
            or self.book.go != self._go_pushed
        )

    async def pushed(self, alive: wirealive.Alive) -> None:
        """The push ``alive`` went out (to whoever answered): what it carried is pushed, not
        what the book holds now (news that came during the push is still due)."""
        self._first_pushed = alive.first
        self._own_pushed = alive.job
        self._go_pushed = alive.go
        await self._deliver()

    async def _deliver(self) -> None:
        self._delivered += 1
        async with self._changed:
            self._changed.notify_all()

    def push_body(self) -> wirealive.Alive:
        """The keep-alive pushed down: our own job and the first failure."""
        spec = self.spec
        own = self.book.state(spec.rank)
        return wirealive.Alive(
            spec.session,
            spec.rank,
            spec.host,
            job=None if own.state == JobStatus.WAITING else own,
            first=self.book.first,
            go=self.book.go,
        )

    async def lost(self, downs: list[Down]) -> None:
        """Nodes named down: each whose job was running is lost (a failure), and a lost node
        that is the new first failure is pushed down at once, as any other."""
        now, first, changed = self._now(), self.book.first, False
        for down in downs:
            cause = down.cause.replace("_", " ")
            detail = f"nothing heard for {down.for_s:.0f} s ({cause}: {down.detail})"
            known = self.book.state(down.rank)
            failed_before = self.book.has_failed(down.rank, known.attempt)
            lost = self.book.lose(down.rank, round(now - down.for_s, 3), detail[:300])
            if lost is not None:
                if not failed_before:  # counted once per node, as _take counts
                    self._metrics.job_failures.labels(jobs.cause(lost)).inc()
                log.warning(
                    "job_lost", extra={"rank": down.rank, "host": down.host, "detail": detail}
                )
                changed = True
        if changed:
            self._first_changed(first)
            await self._changed_now()

    # -- the book's changes ------------------------------------------------------------

    async def _take(
        self,
        incoming: list[JobState],
        *,
        from_upstream: bool = False,
        mine: bool = False,
        go: int = -1,
    ) -> bool:
        book = self.book
        first, go_before = book.first, book.go
        changed = book.learn_go(go)
        for job in incoming:
            named_self_lost = job.rank == self.spec.rank and job.state == JobStatus.LOST
            if named_self_lost and not (from_upstream or mine):
                continue  # only our upstream (or this node, of its vanished run) names us lost
            new_failure = job.failed and not book.has_failed(job.rank, job.attempt)
            if book.note(job):
                changed = True
                if new_failure:
                    self._metrics.job_failures.labels(jobs.cause(job)).inc()
        if self.spec.is_master and self.attempts.ready() and book.advance():
            changed = True
        if not changed:
            return False
        if book.go != go_before:
            self._attempt_started(go_before)
        self._first_changed(first)
        await self._changed_now()
        return True

    def _attempt_started(self, before: int) -> None:
        """The cluster started a later attempt: say so, count a restart, push it down."""
        book = self.book
        failed = book.first_of(before)
        log.info(
            "attempt_started",
            extra={"attempt": book.go, "after": None if failed is None else jobs.describe(failed)},
        )
        if failed is not None:
            self._metrics.job_restarts.labels(jobs.cause(failed)).inc()
        self._metrics.job_attempt.set(book.go)
        if self._pushes_down():
            self.send_down.set()

    def _first_changed(self, before: JobState | None) -> None:
        """Say a new first failure, and push it down at once (master, relays)."""
        first = self.book.first
        if first is None or first == before:
            return
        log.warning(
            "job_first_failure",
            extra={"rank": first.rank, "host": first.host, "what": jobs.describe(first)},
        )
        if self._pushes_down():
            self.send_down.set()

    def _pushes_down(self) -> bool:
        spec = self.spec
        return spec.is_master or bool(fanout.group(spec.rank, self._size, spec.nnodes))

    async def _changed_now(self) -> None:
        counts = self.book.counts()
        for state, count in counts.items():
            self._metrics.jobs.labels(state).set(count)
        async with self._changed:
            self._changed.notify_all()

    # -- what the local API shows -------------------------------------------------------

    def view(self) -> JobView:
        """GET /job and /status "job": this node's job, the first failure, every node's state,
        and the job's progress in this node's attempt."""
        book, spec, now = self.book, self.spec, self._now()
        own = self.attempts.own()
        progress = None if self._progress is None else self._progress.view(own.attempt)
        first = book.first if own.state == JobStatus.STARTING else book.first_of(own.attempt)
        counts = self._counts if len(spec.hosts) > wirealive.MAX_JOBS_SHOWN else book.counts()
        return JobView(
            self._carried, book.version, self.boot, spec.rank, spec.host, book.go,
            ShownState.of(own, now), self.attempts.start(),
            None if first is None else ShownState.of(first, now),
            tuple(ShownState.of(f, now) for f in book.firsts()),
            own.state != JobStatus.STARTING and jobs.stops(first, spec.rank),
            round(self.unsettled_s(), 3), counts,
            tuple(ShownState.of(j, now) for j in book.table(wirealive.MAX_JOBS_SHOWN)), progress,
        )  # fmt: skip
