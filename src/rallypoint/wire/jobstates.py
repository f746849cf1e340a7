"""Pure codec of the supervised job's states: on the keep-alives, from `run` to its sidecar,
and in the job view the local API answers with.

A state travels as a JSON object (jobs.JobState's fields). Peer messages carry them on
POST /v1/alive and its answer (wire/alive.py); `rallypoint run` reports its own job to the
local API's POST /job. Both are untrusted input, checked field by field. GET /job (and POST
/job's answer, and /status "job") is a ``JobView``: every node's state shown with its words
and age (``ShownState``), read back by `run` as the `core.jobs.JobState` it shows
(``ShownState.job``), and the job's progress (``ProgressView``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from rallypoint.core import jobs, progress
from rallypoint.core.jobs import (
    MAX_DETAIL,
    REPORTED,
    Attempt,
    ExitCode,
    Go,
    JobState,
    JobStatus,
    Signal,
    Time,
)
from rallypoint.core.progress import LocalRank, Mark, Period, Phase, Step
from rallypoint.errors import PeerMessageError
from rallypoint.model import Nodes, Rank, at_most, one_of
from rallypoint.wire.fields import dump, host_name, load

__all__ = ["MAX_DETAIL"]

#: Largest local report accepted (a few small fields and a cause).
MAX_REPORT_BYTES = 2048
#: Largest local progress report accepted.
MAX_PROGRESS_BYTES = 512
#: Longest cause a report carries (the child's error file, as one line).
MAX_CAUSE = 200


def cut(job: JobState) -> JobState:
    """A state as peers carry it: times to the millisecond, the detail cut to MAX_DETAIL.

    msgspec writes it (fields at their defaults left out); the state kept here keeps its
    full precision, which orders failures that came within a millisecond.
    """
    return msgspec.structs.replace(
        job,
        started=round(job.started, 3),
        since=round(job.since, 3),
        detail=job.detail[:MAX_DETAIL],
    )


def cut_all(jobs: Sequence[JobState]) -> tuple[JobState, ...]:
    """Several states, as peers carry them."""
    return tuple(cut(job) for job in jobs)


def checked(job: JobState, at: str) -> JobState:
    """A decoded state with its host name checked."""
    return msgspec.structs.replace(job, host=host_name(job.host, f"{at}.host"))


def checked_optional(job: JobState | None, at: str) -> JobState | None:
    """A decoded state or None, its host name checked."""
    return None if job is None else checked(job, at)


def checked_all(jobs: Sequence[JobState], at: str) -> tuple[JobState, ...]:
    """Decoded states with their host names checked."""
    return tuple(checked(job, f"{at}[{index}]") for index, job in enumerate(jobs))


class Report(msgspec.Struct, frozen=True):
    """What `rallypoint run` says of its own job: its state, and when the job started."""

    state: Annotated[str, one_of(REPORTED)]
    #: Unix seconds by the node's own clock (the sidecar corrects them to the master's).
    started: Time
    code: ExitCode | None = None
    signal: Signal | None = None
    #: When the state began, by the node's own clock (None: when the sidecar hears of it).
    #: The child's end as `run` saw it keeps cause before consequence: a peer's collective
    #: fails only after the process that failed first was gone.
    at: Time | None = None
    #: The attempt the job belongs to, as GET /job's "start" gave it (None for starting:
    #: the sidecar numbers it).
    attempt: Attempt | None = None
    #: Why the job failed, as its error file said (cli/errorfile.py): one line.
    detail: Annotated[str, at_most(MAX_CAUSE)] = ""


def encode_report(report: Report) -> bytes:
    """The JSON body of POST /job."""
    return dump(report)


def parse_report(body: bytes) -> Report:
    """Validate a local report; PeerMessageError names the field at fault."""
    report = load(body, Report, MAX_REPORT_BYTES, "job report")
    if report.state == JobStatus.EXITED and report.code is None:
        raise PeerMessageError("job report: an exited job needs its code (0-255)")
    if report.state in (JobStatus.KILLED, JobStatus.TERMINATED) and report.signal is None:
        raise PeerMessageError(f"job report: a {report.state} job needs its signal (1-127)")
    return report


class ProgressReport(msgspec.Struct, frozen=True, omit_defaults=True):
    """A new progress mark of `run`'s job (POST /job/progress), by the node's own clock."""

    attempt: Attempt
    #: The mark's time: the progress file's modification time, Unix seconds.
    at: Time
    step: Step | None = None
    phase: Phase = ""
    #: The local rank whose mark this is (the oldest of them), when each marks its own.
    local_rank: LocalRank | None = None
    #: Seconds since the mark `run` read before this one (None: the first).
    period_s: Period | None = None


def encode_progress(report: ProgressReport) -> bytes:
    """The JSON body of POST /job/progress."""
    return dump(report)


def parse_progress(body: bytes) -> ProgressReport:
    """Validate a local progress report; PeerMessageError names the field at fault."""
    return load(body, ProgressReport, MAX_PROGRESS_BYTES, "progress report")


# -- the job view (GET /job) --------------------------------------------------------------


class ShownState(msgspec.Struct, frozen=True):
    """One node's job state as the local API shows it: the state's fields (its zero times
    and empty detail as null), what happened in words, and ``ago_s`` when it has a time."""

    rank: Rank
    host: str
    state: JobStatus
    what: str = ""
    started: Time | None = None
    since: Time | None = None
    code: ExitCode | None = None
    signal: Signal | None = None
    signal_name: str | None = None
    detail: Annotated[str, at_most(MAX_DETAIL)] | None = None
    attempt: Attempt = 0
    ago_s: float | msgspec.UnsetType = msgspec.UNSET

    @classmethod
    def of(cls, job: JobState, now: float | None = None) -> ShownState:
        """``job`` as shown (``ago_s`` relative to ``now`` when given)."""
        return cls(
            job.rank,
            job.host,
            job.state,
            jobs.describe(job),
            round(job.started, 3) if job.started else None,
            round(job.since, 3) if job.since else None,
            job.code,
            job.signal,
            None if job.signal is None else jobs.signal_name(job.signal),
            job.detail or None,
            job.attempt,
            msgspec.UNSET if now is None or not job.since else round(now - job.since, 3),
        )

    @property
    def job(self) -> JobState:
        """The state it shows, as msgspec reads a state (the nulls are its defaults)."""
        shown = msgspec.structs.asdict(self)
        return msgspec.convert({k: v for k, v in shown.items() if v is not None}, JobState)

    @property
    def ago(self) -> float | None:
        """Seconds since the state began, None when not shown."""
        return None if isinstance(self.ago_s, msgspec.UnsetType) else self.ago_s


class ShownMark(msgspec.Struct, frozen=True):
    """One node's last progress mark as shown: who, where, and how long ago."""

    rank: Rank
    host: str | None = None
    attempt: Attempt = 0
    step: Step | None = None
    phase: str | None = None
    local_rank: LocalRank | None = None
    at: float = 0.0
    age_s: float = 0.0
    where: str = ""

    @classmethod
    def of(cls, mark: Mark, hosts: Sequence[str], now: float) -> ShownMark:
        host = hosts[mark.rank] if mark.rank < len(hosts) else None
        return cls(
            mark.rank, host, mark.attempt, mark.step, mark.phase or None, mark.local_rank,
            round(mark.at, 3), round(max(now - mark.at, 0.0), 3), progress.where(mark),
        )  # fmt: skip


class ProgressView(msgspec.Struct, frozen=True):
    """GET /job's "progress": the cluster's summary of one attempt and the marks held here."""

    attempt: int
    marked: Nodes = 0
    oldest: tuple[ShownMark, ...] = ()
    newest: ShownMark | None = None
    #: Which node's progress stopped first (None with fewer than two marks).
    behind: str | None = None
    nodes: tuple[ShownMark, ...] = ()


class JobView(msgspec.Struct, frozen=True):
    """GET /job, POST /job's answer and /status "job": the supervised job on every node.

    Every field has a default: /status shows a short form before the node list is known
    (``JOBS_UNKNOWN``), and a section that failed as its error alone.
    """

    #: False with --keepalive 0: nothing travels.
    carried: bool = False
    version: int = 0
    #: This sidecar's start: a new one must hear of the job again.
    boot: str = ""
    rank: Rank = 0
    host: str = ""
    #: The attempt the cluster started (-1: none yet).
    attempt: Go = -1
    own: ShownState | None = None
    #: The attempt this node's run may start now, if any.
    start: Attempt | None = None
    first: ShownState | None = None
    attempts: tuple[ShownState, ...] = ()
    stop: bool = False
    unsettled_s: float = 0.0
    counts: dict[JobStatus, int] = {}
    nodes: tuple[ShownState, ...] = ()
    progress: ProgressView | None = None


class JobsUnknown(msgspec.Struct, frozen=True):
    """/status "job" before the node list is known (mDNS discovery): decodes as a JobView."""

    carried: bool = False
    version: int = 0
    first: None = None
    stop: bool = False


JOBS_UNKNOWN = JobsUnknown()
