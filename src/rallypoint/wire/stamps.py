"""Pure codec of the clock fields peer messages carry: an answer's stamps, a report's offset.

An answer (join, verdict, a refusal for staleness) may carry a ``clock`` object: when the
answering node received the request and when it answered, on its clock (the master's, or a
relay's corrected to the master's), and the request's nonce echoed. A report may carry the
sender's measured offset to the master. Both are optional, so peers without them still parse
(docs/readiness.md#clocks). Every number is checked to be finite and within bounds: a bad
value is a PeerMessageError naming the field, never a float that poisons an estimate.
"""

from __future__ import annotations

import re

import msgspec

from rallypoint.errors import PeerMessageError
from rallypoint.wire.fields import number

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
_NONCE = re.compile(r"[0-9a-f]{32}")


class ClockStamp(msgspec.Struct, frozen=True, omit_defaults=True):
    """An answer's clock: when its request arrived and when it left (Unix seconds)."""

    received: float
    answered: float
    source: str
    #: The request's nonce (with a token): proves the answer was made for that request.
    nonce: str | None = None


class ClockFacts(msgspec.Struct, frozen=True):
    """A node's clock against the master's, as it reports it: this node's minus the master's."""

    offset_s: float
    rtt_s: float
    samples: int
    source: str = "master"


def stamp_from(value: object, where: str) -> ClockStamp | None:
    """A stamp from its JSON object, None when absent; PeerMessageError names the field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PeerMessageError(f"{where}: clock must be an object")
    received = seconds(value.get("received"), f"{where}: clock.received", 0.0, MAX_TIMESTAMP)
    answered = seconds(value.get("answered"), f"{where}: clock.answered", 0.0, MAX_TIMESTAMP)
    if not 0.0 <= answered - received <= MAX_HOLD_S:
        raise PeerMessageError(
            f"{where}: clock.answered must be 0-{MAX_HOLD_S:g}s after clock.received"
        )
    nonce = value.get("nonce")
    if nonce is not None and (not isinstance(nonce, str) or not _NONCE.fullmatch(nonce)):
        raise PeerMessageError(f"{where}: clock.nonce must be 32 hex digits")
    return ClockStamp(received, answered, source(value.get("source"), where), nonce)


def facts_from(value: object, where: str) -> ClockFacts | None:
    """Clock facts from their JSON object, None when absent; PeerMessageError names the field."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PeerMessageError(f"{where}: clock must be an object")
    samples = value.get("samples")
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise PeerMessageError(f"{where}: clock.samples must be an integer in 1-{MAX_SAMPLES}")
    return ClockFacts(
        offset_s=seconds(value.get("offset_s"), f"{where}: clock.offset_s", -MAX_OFFSET_S),
        rtt_s=seconds(value.get("rtt_s"), f"{where}: clock.rtt_s", 0.0, MAX_RTT_S),
        samples=samples,
        source=source(value.get("source"), where),
    )


def source(value: object, where: str) -> str:
    """Who answered: "master" or "relay"."""
    if value not in SOURCES:
        raise PeerMessageError(f"{where}: clock.source must be one of {', '.join(SOURCES)}")
    assert isinstance(value, str)
    return value


def seconds(value: object, name: str, low: float, high: float = MAX_OFFSET_S) -> float:
    """A number of seconds (or a timestamp) in low..high: wirefields.number."""
    return number(value, name, low, high)
