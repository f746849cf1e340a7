"""Pure codec of the keep-alive after ready (rendezvous/afterready/keepalive.py): POST
/v1/alive and its answer.

A keep-alive says who sends it and, from a relay, how long ago it heard each member of its
group and which members said goodbye; a goodbye is a keep-alive that says its sender leaves.
The answer names the nodes its sender finds down (liveness.Down), at most MAX_DOWN of them,
with the total, and those it knows left. Both are untrusted input, checked field by field.

They also carry the supervised job (rendezvous/afterready/jobwatch.py): a keep-alive its
sender's own job state, a relay's changed group states and, from the master or a relay, the first
failure; an answer the first failure and, when the asker's copy is older, the job table.
And the job's progress (rendezvous/afterready/progresswatch.py): a keep-alive its sender's
last mark and a relay's group's new ones, an answer the cluster's summary (core/progress.py).
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from rallypoint.core.jobs import KEPT_ATTEMPTS, Go, JobState, JobStatus
from rallypoint.core.liveness import MAX_AGE_S, MAX_DETAIL, Age, Down
from rallypoint.core.progress import Mark, Summary
from rallypoint.errors import PeerMessageError
from rallypoint.model import TOKEN_CHARS, Nodes, Rank, Session, at_most, matching, within
from rallypoint.wire import jobstates
from rallypoint.wire.fields import dump, host_name, load

__all__ = ["MAX_AGE_S", "MAX_DETAIL"]

#: Largest keep-alive accepted: a relay's group (fanout.MAX_GROUP) of ages and job states fits
#: several times.
MAX_ALIVE_BYTES = 60 * 1024
#: Largest answer accepted.
MAX_ANSWER_BYTES = 256 * 1024
#: Most nodes one answer names (the total says how many more there are).
MAX_DOWN = 256
#: Most ages one keep-alive passes on.
MAX_HEARD = 1024
#: Most job states one answer shows (failures first); the counts cover every node.
MAX_JOBS_SHOWN = 256
Version = Annotated[int, within(0, 2**53)]


class Alive(msgspec.Struct, frozen=True):
    """A keep-alive: who sends it and, from a relay, (rank, seconds since heard) of its group."""

    session: Session
    rank: Rank
    #: A host name or an IP literal (fields.host_name checks it after decoding).
    host: str
    heard: Annotated[tuple[tuple[Rank, Age], ...], at_most(MAX_HEARD)] = ()
    #: The sender's own job, when its `run` reported one.
    job: JobState | None = None
    #: A relay's members' job states that changed since its upstream last took them.
    jobs: Annotated[tuple[JobState, ...], at_most(MAX_HEARD)] = ()
    #: The first failure, as the master (or a relay passing it on) knows it.
    first: JobState | None = None
    #: The version of the receiver's job table the sender holds (-1: none).
    jobs_seen: Annotated[int, within(-1, 2**53)] = -1
    #: The attempt the sender knows the cluster started last (-1: none).
    go: Go = -1
    #: Earlier attempts' first failures, for an upstream that restarted and lost them.
    firsts: Annotated[tuple[JobState, ...], at_most(KEPT_ATTEMPTS)] = ()
    #: The sender's job's last progress mark, and a relay's members' new ones.
    mark: Mark | None = None
    marks: Annotated[tuple[Mark, ...], at_most(MAX_HEARD)] = ()
    #: The sender stops on purpose (its sidecar ends): a goodbye, not a death.
    leaving: bool = False
    #: A relay's members that said goodbye to it and were not heard since.
    left: Annotated[tuple[Rank, ...], at_most(MAX_HEARD)] = ()


class AliveAnswer(msgspec.Struct, frozen=True):
    """The answer: who answers, and the nodes it finds down (``total`` of them)."""

    session: Session
    rank: Rank
    down: Annotated[tuple[Down, ...], at_most(MAX_DOWN)]
    total: Nodes
    #: The answering process (a restarted sidecar has a new one: send it everything again).
    boot: Annotated[str, matching(rf"^(?:-|{TOKEN_CHARS})\Z", "- or a token")] = "-"
    #: The first failure of the attempt started last.
    first: JobState | None = None
    #: The answerer's job table version, and the table itself when the asker's is older.
    jobs_version: Version = 0
    jobs: Annotated[tuple[JobState, ...], at_most(MAX_JOBS_SHOWN)] | None = None
    #: How many nodes' jobs are in each state (jobs.JobStatus), as the answerer knows them.
    counts: dict[JobStatus, Nodes] = {}
    #: The attempt the answerer knows the cluster started last (-1: none).
    go: Go = -1
    #: The cluster's progress in that attempt, as the master summed it up.
    progress: Summary | None = None
    #: The nodes the answerer knows left (said goodbye and were not heard since).
    left: Annotated[tuple[Rank, ...], at_most(MAX_DOWN)] = ()


def encode_alive(alive: Alive) -> bytes:
    """The JSON body of a keep-alive: ages to the millisecond, job states as peers carry them."""
    return dump(
        msgspec.structs.replace(
            alive,
            heard=tuple((rank, round(age, 3)) for rank, age in alive.heard),
            job=_cut(alive.job),
            jobs=jobstates.cut_all(alive.jobs),
            first=_cut(alive.first),
            firsts=jobstates.cut_all(alive.firsts),
        )
    )


def parse_alive(body: bytes) -> Alive:
    """Validate a keep-alive; PeerMessageError names the field at fault."""
    alive = load(body, Alive, MAX_ALIVE_BYTES, "keep-alive")
    if alive.job is not None and alive.job.rank != alive.rank:
        raise PeerMessageError("keep-alive: job.rank must be the sender's rank")
    if alive.mark is not None and alive.mark.rank != alive.rank:
        raise PeerMessageError("keep-alive: mark.rank must be the sender's rank")
    return msgspec.structs.replace(
        alive,
        host=host_name(alive.host, "keep-alive: host"),
        job=jobstates.checked_optional(alive.job, "keep-alive: job"),
        jobs=jobstates.checked_all(alive.jobs, "keep-alive: jobs"),
        first=jobstates.checked_optional(alive.first, "keep-alive: first"),
        firsts=jobstates.checked_all(alive.firsts, "keep-alive: firsts"),
    )


def encode_answer(answer: AliveAnswer) -> bytes:
    """The JSON body of the answer, within its limits."""
    return dump(
        msgspec.structs.replace(
            answer,
            down=tuple(
                msgspec.structs.replace(
                    d, for_s=round(min(d.for_s, MAX_AGE_S), 3), detail=d.detail[:MAX_DETAIL]
                )
                for d in answer.down[:MAX_DOWN]
            ),
            first=_cut(answer.first),
            jobs=None if answer.jobs is None else jobstates.cut_all(answer.jobs),
        )
    )


def _cut(job: JobState | None) -> JobState | None:
    return None if job is None else jobstates.cut(job)


def parse_answer(body: bytes) -> AliveAnswer:
    """Validate an answer to a keep-alive."""
    answer = load(body, AliveAnswer, MAX_ANSWER_BYTES, "keep-alive answer")
    if answer.total < len(answer.down):
        raise PeerMessageError("keep-alive answer: total must be at least the nodes down listed")
    return msgspec.structs.replace(
        answer,
        down=tuple(
            msgspec.structs.replace(
                d,
                host=host_name(d.host, f"keep-alive answer: down[{index}].host"),
                seen_by=host_name(d.seen_by, f"keep-alive answer: down[{index}].seen_by"),
            )
            for index, d in enumerate(answer.down)
        ),
        first=jobstates.checked_optional(answer.first, "keep-alive answer: first"),
        jobs=None
        if answer.jobs is None
        else jobstates.checked_all(answer.jobs, "keep-alive answer: jobs"),
    )
