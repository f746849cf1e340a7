"""The supervised job's state on every node, and the first failure (pure).

`rallypoint run` reports its job's start and end to its sidecar; the sidecars carry the
states on their keep-alives (rendezvous/afterready/jobwatch.py). Each node keeps a `JobBook`:
the last known state of every node's job, and every failure it heard of. The first failure is the
earliest one by the master's clock (every node's stamps are corrected to it, core/clock.py), so
every node that heard of the same failures names the same first one.

A failure is a job that ended non-zero or by a signal, a node whose `run` was stopped from
outside (SIGTERM, SIGINT or SIGHUP: preempted, evicted, `docker stop`), and a node named
lost while its job ran. A job that exited 0 is done, and a job this node stopped because
another failed first is a consequence: neither is a failure.

Every run belongs to an **attempt**, numbered by the cluster from 0 (docs/run.md
"Restarting in place"). A `run` that is about to start its child is *starting* for the next
attempt; the master starts an attempt (``JobBook.go``) once every node is starting for it, so
no attempt starts on fewer nodes than the world size and none starts while an earlier one
still runs anywhere. A failure belongs to its attempt: it stops that attempt's runs, and no
later one.
"""

from __future__ import annotations

import enum
import signal as signals
from collections.abc import Iterable
from typing import Annotated

import msgspec

from rallypoint.model import Rank, at_most, within


class JobStatus(enum.StrEnum):
    """Every state a node's job can be in; the order is the order they may follow each other.
    The wire, /job, the CLI and the metrics all name a state by its value."""

    WAITING = "waiting"
    STARTING = "starting"
    RUNNING = "running"
    TERMINATED = "terminated"
    STOPPED = "stopped"
    EXITED = "exited"
    KILLED = "killed"
    STALLED = "stalled"
    LOST = "lost"


_ORDER = {state: index for index, state in enumerate(JobStatus)}
#: What `rallypoint run` reports to its own sidecar (lost is only ever named by the others).
REPORTED = tuple(s for s in JobStatus if s not in (JobStatus.WAITING, JobStatus.LOST))
#: The states of a run that ended on its own node.
ENDED = frozenset({JobStatus.EXITED, JobStatus.KILLED, JobStatus.STOPPED, JobStatus.TERMINATED})
#: The states whose detail is a cause `run` found (its job's error file, where it stalled).
EXPLAINED = frozenset({JobStatus.EXITED, JobStatus.KILLED, JobStatus.STALLED})
#: Attempts are numbered from 0; -1 stands for "none started yet".
MAX_ATTEMPT = 2**31 - 1
Attempt = Annotated[int, within(0, MAX_ATTEMPT)]
Go = Annotated[int, within(-1, MAX_ATTEMPT)]
#: Earlier attempts' first failures kept for /status (the newest ones).
KEPT_ATTEMPTS = 16
#: Longest detail carried (a lost node's cause), in characters.
MAX_DETAIL = 300
#: Times are Unix seconds up to the year 2286; 0.0 means "not yet".
MAX_TIME = 1e10
Time = Annotated[float, within(0.0, MAX_TIME)]
ExitCode = Annotated[int, within(0, 255)]
Signal = Annotated[int, within(1, 127)]
#: The kinds of failure, as the failures metric labels them.
CAUSES = (
    JobStatus.EXITED,
    JobStatus.KILLED,
    JobStatus.TERMINATED,
    JobStatus.STALLED,
    JobStatus.LOST,
)
#: EX_TEMPFAIL (sysexits.h): the default status when a node was lost, the code to requeue on.
LOST_EXIT_CODE = 75
#: The status of a stalled job: its own failure, counted like a crash (not requeued in a loop).
STALLED_EXIT_CODE = 1
#: The signals that stop a node from outside (a scheduler, a runtime, a person at a terminal).
STOP_SIGNALS = (signals.SIGTERM, signals.SIGINT, signals.SIGHUP)


class JobState(msgspec.Struct, frozen=True, omit_defaults=True):
    """One node's job: its state, since when (the master's clock), and how it ended."""

    rank: Rank
    #: A host name or an IP literal (wire/fields.host_name checks it after decoding).
    host: str
    state: JobStatus
    #: When the job started, by its node's own clock (0.0 while waiting): names the run, so
    #: that one run of the job is told from the next.
    started: Time = 0.0
    #: When it entered this state.
    since: Time = 0.0
    #: exited: the exit code.
    code: ExitCode | None = None
    #: killed: the signal that ended it; terminated: the signal `run` was sent.
    signal: Signal | None = None
    #: lost: why (the liveness cause and detail); exited, killed: the cause the job's
    #: error file gave (cli/errorfile.py), if any; stalled: where and for how long.
    detail: Annotated[str, at_most(MAX_DETAIL)] = ""
    #: The attempt this state belongs to (starting: the attempt it waits to start).
    attempt: Attempt = 0

    @property
    def failed(self) -> bool:
        """Whether this state is a failure that stops the job on every other node."""
        if self.state == JobStatus.EXITED:
            return self.code != 0
        return self.state in (
            JobStatus.KILLED,
            JobStatus.TERMINATED,
            JobStatus.STALLED,
            JobStatus.LOST,
        )

    @property
    def key(self) -> tuple[int, float, int, float]:
        """Newer states compare greater: a later attempt, a later run, a later state, a later
        stamp."""
        return (self.attempt, self.started, _ORDER[self.state], self.since)


def signal_name(number: int | None) -> str:
    """SIGTERM for 15; the number itself when it names no signal here."""
    if number is None:
        return "a signal"
    try:
        return signals.Signals(number).name
    except ValueError:
        return f"signal {number}"


def describe(job: JobState) -> str:
    """What happened, in a few words: exited 1, killed by SIGKILL, lost: ..."""
    why = f": {job.detail}" if job.detail else ""
    if job.state == JobStatus.EXITED:
        return f"exited {job.code}{why}"
    if job.state == JobStatus.KILLED:
        return f"killed by {signal_name(job.signal)}{why}"
    if job.state == JobStatus.TERMINATED:
        return f"stopped from outside by {signal_name(job.signal)}"
    if job.state == JobStatus.LOST:
        return f"lost: {job.detail}" if job.detail else "lost"
    if job.state == JobStatus.STALLED:
        return f"stalled {job.detail}" if job.detail else "stalled"
    if job.state == JobStatus.STOPPED:
        return "stopped by the cluster"
    if job.state == JobStatus.STARTING:
        return f"starting attempt {job.attempt}"
    return job.state


def cause(job: JobState) -> str:
    """The failures metric's label: exited, killed, terminated, stalled or lost."""
    return job.state


def exit_status(first: JobState, lost_code: int = LOST_EXIT_CODE) -> int:
    """The status a node stopped because of ``first`` exits with.

    A job's own failure passes on as the shell would say it (its code, 128+N for signal N),
    so a deterministic crash is not requeued in a loop; a stall is the job's own failure too
    (STALLED_EXIT_CODE); a lost node, or one stopped from outside, gives ``lost_code``: the
    one a scheduler maps to a requeue.
    """
    if first.state == JobStatus.EXITED and first.code is not None:
        return first.code
    if first.state == JobStatus.KILLED and first.signal is not None:
        return 128 + first.signal
    if first.state == JobStatus.STALLED:
        return STALLED_EXIT_CODE
    return lost_code


def stops(first: JobState | None, rank: int) -> bool:
    """Whether a node of ``rank`` whose job still runs must stop it, given the first failure.

    Every failure but this node's own stops it; so does this node named lost (the others
    stopped: a node cut off and healed must not run alone).
    """
    return first is not None and (first.rank != rank or first.state == JobStatus.LOST)


def line(first: JobState, before_s: float | None) -> str:
    """One line naming the first failure: node, rank, what, when (relative to now), and its
    attempt when it is not the first."""
    when = ""
    if before_s is not None:
        when = (
            f", {before_s:.1f} s before this node's stop"
            if before_s >= 0
            else f", {-before_s:.1f} s after this node's stop"
        )
    attempt = f" in attempt {first.attempt}" if first.attempt else ""
    return f"first failure{attempt}: {first.host} (rank {first.rank}) {describe(first)}{when}"


class JobBook:
    """What one node knows of every node's job: last states, each attempt's failures and
    first failure, and the attempt the cluster started last."""

    def __init__(self, hosts: Iterable[str]) -> None:
        self.hosts = tuple(hosts)
        self._states: dict[int, JobState] = {}
        #: (attempt, rank) -> that node's failure in that attempt.
        self._failures: dict[tuple[int, int], JobState] = {}
        #: attempt -> its first failure (the newest KEPT_ATTEMPTS attempts').
        self._firsts: dict[int, JobState] = {}
        #: Nodes per state, kept as states change: counts() is read at every change.
        self._counts = dict.fromkeys(JobStatus, 0)
        self._counts[JobStatus.WAITING] = len(self.hosts)
        #: attempt -> how many nodes are starting for it.
        self._starting: dict[int, int] = {}
        #: The attempt the cluster started last (-1: none yet).
        self.go = -1
        #: Goes up by one with every change: readers wait for a version after theirs.
        self.version = 0

    @property
    def first(self) -> JobState | None:
        """The first failure of the attempt started last."""
        return self._firsts.get(self.go)

    def first_of(self, attempt: int) -> JobState | None:
        """The first failure of ``attempt`` (None: none known)."""
        return self._firsts.get(attempt)

    def firsts(self) -> list[JobState]:
        """Each earlier attempt's first failure that is kept, oldest first."""
        return [self._firsts[a] for a in sorted(self._firsts)]

    def note(self, job: JobState) -> bool:
        """Take ``job`` if it is newer than what is known of its node; whether anything changed.

        Every failure is kept (each node's first in each attempt), so a node's later state (a
        lost node's sidecar back, an end after a stop from outside) never hides it. A state
        of an attempt past ``go`` that is not starting (or stopped: a run that gave up waiting
        for it) says the cluster started that attempt.
        """
        if not 0 <= job.rank < len(self.hosts) or job.state not in _ORDER:
            return False
        changed = False
        known = self._states.get(job.rank)
        if known is None or job.key > known.key:
            self._states[job.rank] = job
            self._counts[JobStatus.WAITING if known is None else known.state] -= 1
            self._counts[job.state] += 1
            self._count_starting(known, -1)
            self._count_starting(job, +1)
            changed = True
        if (
            job.state not in (JobStatus.WAITING, JobStatus.STARTING, JobStatus.STOPPED)
            and job.attempt > self.go
        ):
            self.go = job.attempt
            changed = True
        if job.failed and self._keep_failure(job):
            changed = True
        if changed:
            self.version += 1
        return changed

    def recall(self, job: JobState) -> bool:
        """Take an earlier attempt's first failure as history (a restarted node hears it
        from the others): it changes no node's state, nor the attempt under way."""
        if not (0 <= job.rank < len(self.hosts) and job.failed and job.attempt < self.go):
            return False
        if not self._keep_failure(job):
            return False
        self.version += 1
        return True

    def _keep_failure(self, job: JobState) -> bool:
        """Keep ``job``, a failure, as its node's in its attempt, and as that attempt's
        first when it is the earliest; whether it was new."""
        key = (job.attempt, job.rank)
        if key in self._failures:
            return False
        if len(self._firsts) >= KEPT_ATTEMPTS and job.attempt < min(self._firsts):
            return False  # older than every attempt kept: forgotten, and no news
        self._failures[key] = job
        first = self._firsts.get(job.attempt)
        if first is None or _earlier(job, first):
            self._firsts[job.attempt] = job
            for old in sorted(self._firsts)[:-KEPT_ATTEMPTS]:
                del self._firsts[old]
            # A long session restarts again and again: keep the failures of the attempts
            # kept, not every failure since the sidecar started.
            oldest = min(self._firsts)
            for stale in [k for k in self._failures if k[0] < oldest]:
                del self._failures[stale]
        return True

    def _count_starting(self, job: JobState | None, by: int) -> None:
        if job is None or job.state != JobStatus.STARTING:
            return
        left = self._starting.get(job.attempt, 0) + by
        if left > 0:
            self._starting[job.attempt] = left
        else:
            self._starting.pop(job.attempt, None)

    def learn_go(self, go: int) -> bool:
        """Another node says the cluster started attempt ``go``; whether that is news."""
        if go <= self.go:
            return False
        self.go = go
        self.version += 1
        return True

    def advance(self) -> bool:
        """The master's decision: start the next attempt when every node is starting for it
        (and it is past the last one started); whether it did."""
        ready = [a for a, n in self._starting.items() if n == len(self.hosts) and a > self.go]
        if not ready:
            return False
        self.go = max(ready)
        self.version += 1
        return True

    def has_failed(self, rank: int, attempt: int) -> bool:
        """Whether a failure of ``rank`` in ``attempt`` is known."""
        return (attempt, rank) in self._failures

    def lose(self, rank: int, at: float, detail: str) -> JobState | None:
        """Name ``rank`` lost if its job was running (or stopping); the lost state, else None."""
        known = self._states.get(rank)
        if known is None or known.state not in (JobStatus.RUNNING, JobStatus.TERMINATED):
            return None
        lost = JobState(
            rank,
            known.host,
            JobStatus.LOST,
            known.started,
            at,
            detail=detail,
            attempt=known.attempt,
        )
        return lost if self.note(lost) else None

    def state(self, rank: int) -> JobState:
        """The last known state of ``rank``'s job (waiting when nothing was heard)."""
        known = self._states.get(rank)
        if known is not None:
            return known
        host = self.hosts[rank] if 0 <= rank < len(self.hosts) else "?"
        return JobState(rank, host, JobStatus.WAITING)

    def states(self) -> list[JobState]:
        """Every known state, by rank."""
        return [self._states[r] for r in sorted(self._states)]

    def failures(self) -> list[JobState]:
        """Every failure heard of, earliest first."""
        return sorted(self._failures.values(), key=lambda j: (j.attempt, j.since, j.rank))

    def counts(self) -> dict[JobStatus, int]:
        """How many nodes' jobs are in each state (nodes never heard of count as waiting)."""
        return dict(self._counts)

    def table(self, limit: int) -> list[JobState]:
        """At most ``limit`` states to show: failures first, then the rest by rank."""
        failed = [j for j in self.states() if j.failed]
        rest = [j for j in self.states() if not j.failed]
        return (failed + rest)[:limit]


def _earlier(a: JobState, b: JobState) -> bool:
    return (a.since, a.rank) < (b.since, b.rank)
