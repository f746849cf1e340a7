"""Pure codec of the keep-alive after ready (rendezvous/keepalive.py): POST /v1/alive, its answer.

A keep-alive says who sends it and, from a relay, how long ago it heard each member of its
group. The answer names the nodes its sender finds down (liveness.Down), at most MAX_DOWN
of them, with the total. Both are untrusted input, checked field by field.

They also carry the supervised job (rendezvous/jobwatch.py): a keep-alive its sender's own
job state, a relay's changed group states and, from the master or a relay, the first
failure; an answer the first failure and, when the asker's copy is older, the job table.
"""

from __future__ import annotations

import msgspec

from rallypoint.core.jobs import STATES, JobState
from rallypoint.core.liveness import CAUSES, Down
from rallypoint.errors import PeerMessageError
from rallypoint.wire import jobs as wirejobs
from rallypoint.wire.fields import MAX_NODES, TOKEN, dump, host_name, integer, load, number, session

#: Largest keep-alive accepted: a relay's group (fanout.MAX_GROUP) of ages and job states fits
#: several times.
MAX_ALIVE_BYTES = 60 * 1024
#: Largest answer accepted.
MAX_ANSWER_BYTES = 256 * 1024
#: Most nodes one answer names (the total says how many more there are).
MAX_DOWN = 256
#: Most ages one keep-alive passes on.
MAX_HEARD = 1024
#: Longest detail carried, in characters (a cut-down error message).
MAX_DETAIL = 300
#: Ages and durations are capped at a day: past it, the number tells nothing more.
MAX_AGE_S = 86400.0
#: Most job states one answer shows (failures first); the counts cover every node.
MAX_JOBS_SHOWN = 256


class Alive(msgspec.Struct, frozen=True):
    """A keep-alive: who sends it and, from a relay, (rank, seconds since heard) of its group."""

    session: str
    rank: int
    host: str
    heard: tuple[tuple[int, float], ...] = ()
    #: The sender's own job, when its `run` reported one.
    job: JobState | None = None
    #: A relay's members' job states that changed since its upstream last took them.
    jobs: tuple[JobState, ...] = ()
    #: The first failure, as the master (or a relay passing it on) knows it.
    first: JobState | None = None
    #: The version of the receiver's job table the sender holds (-1: none).
    jobs_seen: int = -1


class AliveAnswer(msgspec.Struct, frozen=True):
    """The answer: who answers, and the nodes it finds down (``total`` of them)."""

    session: str
    rank: int
    down: tuple[Down, ...]
    total: int
    #: The answering process (a restarted sidecar has a new one: send it everything again).
    boot: str = "-"
    first: JobState | None = None
    #: The answerer's job table version, and the table itself when the asker's is older.
    jobs_version: int = 0
    jobs: tuple[JobState, ...] | None = None
    #: How many nodes' jobs are in each state (jobs.STATES), as the answerer knows them.
    counts: tuple[tuple[str, int], ...] = ()


def encode_alive(alive: Alive) -> bytes:
    """The JSON body of a keep-alive: ages to the millisecond, job states as peers carry them."""
    return dump(
        msgspec.structs.replace(
            alive,
            heard=tuple((rank, round(age, 3)) for rank, age in alive.heard),
            job=_cut(alive.job),
            jobs=wirejobs.cut_all(alive.jobs),
            first=_cut(alive.first),
        )
    )


def parse_alive(body: bytes) -> Alive:
    """Validate a keep-alive; PeerMessageError names the field at fault."""
    data = load(body, MAX_ALIVE_BYTES, "keep-alive")
    heard = data.get("heard", [])
    if not isinstance(heard, list) or len(heard) > MAX_HEARD:
        raise PeerMessageError(f"keep-alive: heard must be a list of at most {MAX_HEARD}")
    pairs = []
    for index, item in enumerate(heard):
        if not isinstance(item, list) or len(item) != 2:
            raise PeerMessageError(f"keep-alive: heard[{index}] must be [rank, seconds]")
        pairs.append(
            (
                integer(item[0], f"heard[{index}] rank", 0, MAX_NODES - 1),
                number(item[1], f"heard[{index}] seconds", 0.0, MAX_AGE_S),
            )
        )
    rank = integer(data.get("rank"), "rank", 0, MAX_NODES - 1)
    job = wirejobs.parse_optional(data.get("job"), "keep-alive: job")
    if job is not None and job.rank != rank:
        raise PeerMessageError("keep-alive: job.rank must be the sender's rank")
    return Alive(
        session=session(data.get("session"), "session"),
        rank=rank,
        host=host_name(data.get("host")),
        heard=tuple(pairs),
        job=job,
        jobs=wirejobs.parse_all(data.get("jobs", []), "keep-alive: jobs", MAX_HEARD),
        first=wirejobs.parse_optional(data.get("first"), "keep-alive: first"),
        jobs_seen=integer(data.get("jobs_seen", -1), "jobs_seen", -1, 2**53),
    )


def encode_answer(answer: AliveAnswer) -> bytes:
    """The JSON body of the answer, within its limits; ``counts`` as an object."""
    carried = msgspec.structs.replace(
        answer,
        down=tuple(
            msgspec.structs.replace(
                d, for_s=round(min(d.for_s, MAX_AGE_S), 3), detail=d.detail[:MAX_DETAIL]
            )
            for d in answer.down[:MAX_DOWN]
        ),
        first=_cut(answer.first),
        jobs=None if answer.jobs is None else wirejobs.cut_all(answer.jobs),
    )
    return dump({**msgspec.structs.asdict(carried), "counts": dict(answer.counts)})


def _cut(job: JobState | None) -> JobState | None:
    return None if job is None else wirejobs.cut(job)


def parse_answer(body: bytes) -> AliveAnswer:
    """Validate an answer to a keep-alive."""
    data = load(body, MAX_ANSWER_BYTES, "keep-alive answer")
    raw = data.get("down")
    if not isinstance(raw, list) or len(raw) > MAX_DOWN:
        raise PeerMessageError(f"keep-alive answer: down must be a list of at most {MAX_DOWN}")
    downs = []
    for index, item in enumerate(raw):
        at = f"down[{index}]"
        if not isinstance(item, dict):
            raise PeerMessageError(f"keep-alive answer: {at} is not an object")
        cause, detail = item.get("cause"), item.get("detail")
        if cause not in CAUSES:
            raise PeerMessageError(f"{at}.cause must be one of {', '.join(CAUSES)}")
        if not isinstance(detail, str) or len(detail) > MAX_DETAIL:
            raise PeerMessageError(f"{at}.detail must be a string of at most {MAX_DETAIL}")
        downs.append(
            Down(
                rank=integer(item.get("rank"), f"{at}.rank", 0, MAX_NODES - 1),
                host=host_name(item.get("host"), f"{at}.host"),
                for_s=number(item.get("for_s"), f"{at}.for_s", 0.0, MAX_AGE_S),
                cause=str(cause),
                detail=detail,
                seen_by=host_name(item.get("seen_by"), f"{at}.seen_by"),
            )
        )
    jobs = data.get("jobs")
    boot = data.get("boot", "-")
    if not isinstance(boot, str) or not (boot == "-" or TOKEN.fullmatch(boot)):
        raise PeerMessageError("keep-alive answer: boot must be a token")
    return AliveAnswer(
        session=session(data.get("session"), "session"),
        rank=integer(data.get("rank"), "rank", 0, MAX_NODES - 1),
        down=tuple(downs),
        total=integer(data.get("total"), "total", len(downs), MAX_NODES),
        boot=boot,
        first=wirejobs.parse_optional(data.get("first"), "keep-alive answer: first"),
        jobs_version=integer(data.get("jobs_version", 0), "jobs_version", 0, 2**53),
        jobs=None
        if jobs is None
        else wirejobs.parse_all(jobs, "keep-alive answer: jobs", MAX_JOBS_SHOWN),
        counts=_counts(data.get("counts", {})),
    )


def _counts(value: object) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or any(k not in STATES for k in value):
        raise PeerMessageError(f"keep-alive answer: counts must map {', '.join(STATES)} to counts")
    return tuple((k, integer(v, f"counts.{k}", 0, MAX_NODES)) for k, v in sorted(value.items()))
