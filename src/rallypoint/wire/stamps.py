"""Pure codec of the clock fields peer messages carry: an answer's stamps, a report's offset.

An answer (join, verdict, a refusal for staleness) may carry a ``clock`` object: when the
answering node received the request and when it answered, on its clock (the master's, or a
relay's corrected to the master's), and the request's nonce echoed. A report may carry the
sender's measured offset to the master. Both are optional, so peers without them still parse
(docs/readiness.md#clocks). Every number is checked to be finite and within bounds: a bad
value is a PeerMessageError naming the field, never a float that poisons an estimate.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from rallypoint.errors import PeerMessageError
from rallypoint.model import one_of, text, within
from rallypoint.wire.fields import load

#: Largest Unix timestamp accepted (auth.py's timestamps have at most 12 digits).
MAX_TIMESTAMP = 1e12
#: Longest an answer may have been held (a long-poll) between receipt and answer.
MAX_HOLD_S = 24 * 3600.0
#: Largest offset or round trip a report may claim.
MAX_OFFSET_S = 1e12
MAX_RTT_S = 3600.0
#: Largest number of samples a report may claim.
MAX_SAMPLES = 1 << 20
#: Who answered: the master itself, or a relay on its corrected clock.
SOURCES = ("master", "relay")
#: Largest refusal whose stamp is read (a refusal is a short JSON error).
MAX_REFUSAL_BYTES = 64 * 1024
Timestamp = Annotated[float, within(0.0, MAX_TIMESTAMP)]
Source = Annotated[str, one_of(SOURCES)]


class ClockStamp(msgspec.Struct, frozen=True, omit_defaults=True):
    """An answer's clock: when its request arrived and when it left (Unix seconds)."""

    received: Timestamp
    answered: Timestamp
    source: Source
    #: The request's nonce (with a token): proves the answer was made for that request.
    nonce: Annotated[str, text(r"^[0-9a-f]{32}\Z", "32 hex digits")] | None = None


class ClockFacts(msgspec.Struct, frozen=True):
    """A node's clock against the master's, as it reports it: this node's minus the master's."""

    offset_s: Annotated[float, within(-MAX_OFFSET_S, MAX_OFFSET_S)]
    rtt_s: Annotated[float, within(0.0, MAX_RTT_S)]
    samples: Annotated[int, within(1, MAX_SAMPLES)]
    source: Source = "master"


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
