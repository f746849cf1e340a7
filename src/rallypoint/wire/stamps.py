"""Pure codec of the clock fields peer messages carry: an answer's stamps, a report's offset
(their types are core/clock.py's).

An answer (join, verdict, a refusal for staleness) may carry a ``clock`` object: when the
answering node received the request and when it answered, on its clock (the master's, or a
relay's corrected to the master's), and the request's nonce echoed. A report may carry the
sender's measured offset to the master. Both are optional, so peers without them still parse
(docs/readiness.md#clocks). Every number is checked to be finite and within bounds: a bad
value is a PeerMessageError naming the field, never a float that poisons an estimate.
"""

from __future__ import annotations

import msgspec

from rallypoint.core.clock import MAX_HOLD_S, ClockStamp
from rallypoint.errors import PeerMessageError
from rallypoint.wire.fields import load

#: Largest refusal whose stamp is read (a refusal is a short JSON error).
MAX_REFUSAL_BYTES = 64 * 1024


class _Stamped(msgspec.Struct, frozen=True):
    """Any answer, read only for its clock."""

    clock: ClockStamp | None = None


def checked_stamp(stamp: ClockStamp | None, where: str) -> ClockStamp | None:
    """A decoded stamp, checked that it answered within MAX_HOLD_S of receiving."""
    if stamp is not None and not 0.0 <= stamp.answered - stamp.received <= MAX_HOLD_S:
        raise PeerMessageError(
            f"{where}: clock.answered must be 0-{MAX_HOLD_S:g}s after clock.received"
        )
    return stamp


def stamp_of(body: bytes, where: str) -> ClockStamp | None:
    """The stamp of any answer (a refusal, say), None when it has none."""
    return checked_stamp(load(body, _Stamped, MAX_REFUSAL_BYTES, where).clock, where)
