"""Pure codec of a relay's batches: its group's joins and its group's reports, for the master.

A batch carries the same JSON objects as the single messages (a Member, a wire.Report), so
the master checks every item with the rules it applies to a direct join or report. Batches
stay under MAX_BATCH_BYTES: a relay cuts larger ones (chunks()).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, TypeVar

import msgspec

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import MAX_NODES, Member, Session, Token, at_most, within
from rallypoint.wire.fields import dump, load

T = TypeVar("T")

#: Largest batch accepted (the peer API's own body limit is 64 KiB).
MAX_BATCH_BYTES = 60 * 1024
#: Most items one batch carries.
MAX_ITEMS = 1024
Relay = Annotated[int, within(1, MAX_NODES - 1)]


class JoinBatch(msgspec.Struct, frozen=True):
    """A relay's POST /v1/joins: members of its group that joined it, for the master."""

    session: Session
    relay: Relay
    members: Annotated[tuple[Member, ...], at_most(MAX_ITEMS)]


class ReportBatch(msgspec.Struct, frozen=True):
    """A relay's POST /v1/reports: its group's reports of one generation, and the verdict seen.

    The master answers with its verdict like a report, as a long-poll while ``seen`` is
    current; ``hold`` False asks for the answer at once (more chunks follow).
    """

    session: Session
    generation: Token
    relay: Relay
    reports: Annotated[tuple[wire.Report, ...], at_most(MAX_ITEMS)]
    seen: wire.Seen = -1
    hold: bool = True


def encode_join_batch(batch: JoinBatch) -> bytes:
    return dump(batch)


def parse_join_batch(body: bytes) -> JoinBatch:
    """Validate a join batch; PeerMessageError names the item and field at fault."""
    batch = load(body, JoinBatch, MAX_BATCH_BYTES, "join batch")
    members = tuple(
        wire.checked_member(member, f"join batch: members[{index}]")
        for index, member in enumerate(batch.members)
    )
    return msgspec.structs.replace(batch, members=members)


def encode_report_batch(batch: ReportBatch) -> bytes:
    return dump(batch)


def parse_report_batch(body: bytes) -> ReportBatch:
    """Validate a report batch; every report must be of the batch's session and generation."""
    batch = load(body, ReportBatch, MAX_BATCH_BYTES, "report batch")
    for report in batch.reports:
        if report.session != batch.session or report.generation != batch.generation:
            raise PeerMessageError(
                f"report batch: the report of rank {report.rank} is for another session or "
                "generation than the batch"
            )
    reports = tuple(
        wire.checked_report(report, f"report batch: reports[{index}]")
        for index, report in enumerate(batch.reports)
    )
    return msgspec.structs.replace(batch, reports=reports)


def chunks(items: Iterable[T], size_of: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` cut into lists whose encoded sizes sum to less than a batch's limit."""
    budget = MAX_BATCH_BYTES - 1024  # the batch's own fields
    chunk: list[T] = []
    size = 0
    for item in items:
        need = size_of(item) + 1
        if chunk and (size + need > budget or len(chunk) >= MAX_ITEMS):
            yield chunk
            chunk, size = [], 0
        chunk.append(item)
        size += need
    if chunk:
        yield chunk
