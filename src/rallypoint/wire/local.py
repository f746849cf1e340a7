"""The local API's answers, typed once (pure): server/local.py sends them, cli/client.py
decodes them into the same types.

Each JSON route of the local API names its answer type in its row (localapi.py). The server
writes a type's builtins (``answer``) as aiohttp always wrote the local API's dicts, so the
JSON on the wire keeps its field names, its order and its nulls; the client decodes an answer
with msgspec, which checks every field (``load``). A job state is shown with its words and
age (``ShownState``) and read back as the `core.jobs.JobState` it shows (``ShownState.job``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

import msgspec

from rallypoint.core import jobs, progress
from rallypoint.core.jobs import (
    MAX_DETAIL,
    Attempt,
    ExitCode,
    Go,
    JobState,
    JobStatus,
    Signal,
    Time,
)
from rallypoint.core.progress import LocalRank, Mark, Step
from rallypoint.model import Nodes, Rank, at_most
from rallypoint.reasons import Reason
from rallypoint.wire import fields

T = TypeVar("T")

#: GET /env?format=json: the contract's variables, names to values.
EnvValues = dict[str, str]


class ErrorAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every refusal of either API: one line, and a stable code when there is one."""

    error: str
    code: str | None = None


class NotReadyAnswer(msgspec.Struct, frozen=True):
    """The 503 of /env and /hostfile: why the node is not ready."""

    ready: bool = False
    reasons: tuple[Reason, ...] = ()


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


class StatusSpec(msgspec.Struct, frozen=True):
    """/status "spec": the cluster spec this node works from."""

    provider: str = ""
    session: str = ""
    hosts: tuple[str, ...] = ()
    rank: Rank = 0
    nnodes: Nodes = 0
    master: str | None = None


class StatusView(msgspec.Struct, frozen=True):
    """GET /status as the CLI reads it: readiness, the spec and the job typed; the sections
    it only renders kept as the JSON they are (the whole document is `status --json`'s).
    The head is UNSET where a document leaves it out (a section that failed to render)."""

    ready: bool
    reasons: tuple[Reason, ...] = ()
    generation: str | msgspec.UnsetType | None = msgspec.UNSET
    role: str | msgspec.UnsetType = msgspec.UNSET
    spec: StatusSpec | msgspec.UnsetType = msgspec.UNSET
    peers: tuple[dict[str, Any], ...] = ()
    overrides: tuple[dict[str, Any], ...] = ()
    warnings: tuple[Any, ...] = ()
    ports: dict[str, Any] = {}
    auth: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    liveness: dict[str, Any] = {}
    job: JobView | None = None


def answer(value: object) -> Any:
    """An answer as the builtins the server writes (json.dumps: the bytes it always wrote)."""
    return msgspec.to_builtins(value)


#: The largest answer the client decodes (a 4096-node master's /status is a few MiB).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def load(body: bytes, kind: type[T], what: str) -> T:
    """The ``kind`` in an answer's ``body``; PeerMessageError saying in one line what is
    wrong when it is not one (``what`` names the route)."""
    return fields.load(body, kind, MAX_ANSWER_BYTES, what)
