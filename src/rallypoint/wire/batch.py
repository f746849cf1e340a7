"""Pure codec of a relay's batches: its group's joins and its group's reports, for the master.

A batch carries the same JSON objects as the single messages (a Member, a wire.Report), so
the master checks every item with the rules it applies to a direct join or report. Batches
stay under MAX_BATCH_BYTES: a relay cuts larger ones (chunks()).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import msgspec

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import Member
from rallypoint.wire.fields import MAX_NODES, boolean, dump, generation, integer, load, session

T = TypeVar("T")

#: Largest batch accepted (the peer API's own body limit is 64 KiB).
MAX_BATCH_BYTES = 60 * 1024
#: Most items one batch carries.
MAX_ITEMS = 1024


class JoinBatch(msgspec.Struct, frozen=True):
    """A relay's POST /v1/joins: members of its group that joined it, for the master."""

    session: str
    relay: int
    members: tuple[Member, ...]


class ReportBatch(msgspec.Struct, frozen=True):
    """A relay's POST /v1/reports: its group's reports of one generation, and the verdict seen.

    The master answers with its verdict like a report, as a long-poll while ``seen`` is
    current; ``hold`` False asks for the answer at once (more chunks follow).
    """

    session: str
    generation: str
    relay: int
    reports: tuple[wire.Report, ...]
    seen: int = -1
    hold: bool = True


def encode_join_batch(batch: JoinBatch) -> bytes:
    return dump(batch)


def parse_join_batch(body: bytes) -> JoinBatch:
    """Validate a join batch; PeerMessageError names the item and field at fault."""
    data = load(body, MAX_BATCH_BYTES, "join batch")
    raw = _items(data.get("members"), "join batch", "members")
    return JoinBatch(
        session=session(data.get("session"), "session"),
        relay=integer(data.get("relay"), "relay", 1, MAX_NODES - 1),
        members=tuple(wire.member_from(item, f"members[{i}]") for i, item in enumerate(raw)),
    )


def encode_report_batch(batch: ReportBatch) -> bytes:
    return dump(batch)


def parse_report_batch(body: bytes) -> ReportBatch:
    """Validate a report batch; every report must be of the batch's session and generation."""
    data = load(body, MAX_BATCH_BYTES, "report batch")
    raw = _items(data.get("reports"), "report batch", "reports")
    batch = ReportBatch(
        session=session(data.get("session"), "session"),
        generation=generation(data.get("generation"), "generation"),
        relay=integer(data.get("relay"), "relay", 1, MAX_NODES - 1),
        reports=tuple(wire.report_from(item) for item in raw),
        seen=integer(data.get("seen", -1), "seen", -1, 1 << 62),
        hold=boolean(data.get("hold", True), "hold"),
    )
    for report in batch.reports:
        if report.session != batch.session or report.generation != batch.generation:
            raise PeerMessageError(
                f"report batch: the report of rank {report.rank} is for another session or "
                "generation than the batch"
            )
    return batch


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


def _items(value: object, what: str, field: str) -> list[dict[str, object]]:
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        raise PeerMessageError(f"{what}: {field} must be a list of at most {MAX_ITEMS}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise PeerMessageError(f"{what}: {field}[{index}] is not an object")
    return value
