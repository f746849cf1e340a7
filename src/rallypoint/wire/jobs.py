"""Pure codec of the supervised job's states: on the keep-alives, and from `run` to its sidecar.

A state travels as a JSON object (jobs.JobState's fields). Peer messages carry them on
POST /v1/alive and its answer (wire/alive.py); `rallypoint run` reports its own job to the
local API's POST /job. Both are untrusted input, checked field by field.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from rallypoint.core.jobs import REPORTED, STATES, JobState
from rallypoint.errors import PeerMessageError
from rallypoint.wire.fields import MAX_NODES, dump, host_name, integer, load, number

#: Longest detail carried (a lost node's cause), in characters.
MAX_DETAIL = 300
#: Times are Unix seconds up to the year 2286; 0.0 means "not yet".
MAX_TIME = 1e10
#: Largest local report accepted (a few small fields).
MAX_REPORT_BYTES = 1024


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


def parse(value: object, at: str) -> JobState:
    """A peer's state of one node's job; PeerMessageError names the field at fault."""
    if not isinstance(value, dict):
        raise PeerMessageError(f"{at} must be an object")
    state, detail = value.get("state"), value.get("detail", "")
    if state not in STATES:
        raise PeerMessageError(f"{at}.state must be one of {', '.join(STATES)}")
    if not isinstance(detail, str) or len(detail) > MAX_DETAIL:
        raise PeerMessageError(f"{at}.detail must be a string of at most {MAX_DETAIL}")
    return JobState(
        rank=integer(value.get("rank"), f"{at}.rank", 0, MAX_NODES - 1),
        host=host_name(value.get("host"), f"{at}.host"),
        state=str(state),
        started=number(value.get("started", 0.0), f"{at}.started", 0.0, MAX_TIME),
        since=number(value.get("since", 0.0), f"{at}.since", 0.0, MAX_TIME),
        code=_optional(value.get("code"), f"{at}.code", 255),
        signal=_signal(value.get("signal"), f"{at}.signal"),
        detail=detail,
    )


def parse_all(value: object, at: str, most: int) -> tuple[JobState, ...]:
    """A list of at most ``most`` states."""
    if not isinstance(value, list) or len(value) > most:
        raise PeerMessageError(f"{at} must be a list of at most {most} job states")
    return tuple(parse(item, f"{at}[{index}]") for index, item in enumerate(value))


def parse_optional(value: object, at: str) -> JobState | None:
    """A state, or null."""
    return None if value is None else parse(value, at)


class Report(msgspec.Struct, frozen=True):
    """What `rallypoint run` says of its own job: its state, and when the job started."""

    state: str
    #: Unix seconds by the node's own clock (the sidecar corrects them to the master's).
    started: float
    code: int | None = None
    signal: int | None = None
    #: When the state began, by the node's own clock (None: when the sidecar hears of it).
    #: The child's end as `run` saw it keeps cause before consequence: a peer's collective
    #: fails only after the process that failed first was gone.
    at: float | None = None


def encode_report(report: Report) -> bytes:
    """The JSON body of POST /job."""
    return dump(report)


def parse_report(body: bytes) -> Report:
    """Validate a local report; PeerMessageError names the field at fault."""
    data = load(body, MAX_REPORT_BYTES, "job report")
    state = data.get("state")
    if state not in REPORTED:
        raise PeerMessageError(f"job report: state must be one of {', '.join(REPORTED)}")
    code = _optional(data.get("code"), "code", 255)
    signal = _signal(data.get("signal"), "signal")
    at = data.get("at")
    if state == "exited" and code is None:
        raise PeerMessageError("job report: an exited job needs its code (0-255)")
    if state in ("killed", "terminated") and signal is None:
        raise PeerMessageError(f"job report: a {state} job needs its signal (1-127)")
    return Report(
        state=str(state),
        started=number(data.get("started"), "started", 0.0, MAX_TIME),
        code=code,
        signal=signal,
        at=None if at is None else number(at, "at", 0.0, MAX_TIME),
    )


def _signal(value: object, at: str) -> int | None:
    return None if value is None else integer(value, at, 1, 127)


def _optional(value: object, at: str, high: int) -> int | None:
    return None if value is None else integer(value, at, 0, high)
