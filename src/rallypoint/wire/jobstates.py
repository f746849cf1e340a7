"""Pure codec of the supervised job's states: on the keep-alives, and from `run` to its sidecar.

A state travels as a JSON object (jobs.JobState's fields). Peer messages carry them on
POST /v1/alive and its answer (wire/alive.py); `rallypoint run` reports its own job to the
local API's POST /job. Both are untrusted input, checked field by field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from rallypoint.core.jobs import (
    MAX_DETAIL,
    REPORTED,
    Attempt,
    ExitCode,
    JobState,
    JobStatus,
    Signal,
    Time,
)
from rallypoint.core.progress import LocalRank, Period, Phase, Step
from rallypoint.errors import PeerMessageError
from rallypoint.model import at_most, one_of
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
