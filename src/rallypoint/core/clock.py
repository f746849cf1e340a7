"""Clock offsets to the master, measured on the exchanges the rendezvous makes anyway.

NTP's on-wire arithmetic (RFC 5905, section 8): a worker notes t1 on its wall clock when it
sends a join or a report and t4 when the answer arrives; the answer carries t2 (received) and
t3 (answered) on the master's clock (ClockStamp, below; wire/stamps.py reads it). Then the
master's clock minus this node's is ((t2 - t1) + (t3 - t4)) / 2, within half the round trip
(t4 - t1) - (t3 - t2). Of the last SAMPLES_KEPT samples the one with the lowest round trip
is the estimate. Here ``offset_s`` is always this node's clock minus the master's (positive:
ahead), the opposite sign of NTP's theta, so that "sub2 is 600 s ahead" reads as +600.

A worker signs and checks peer messages on its corrected clock (``now``); the master, the
reference, never corrects (docs/readiness.md#clocks says why that keeps replays out).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Annotated

import msgspec

from rallypoint.model import ClusterSpec, matching, one_of, within
from rallypoint.reasons import Reason

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
Timestamp = Annotated[float, within(0.0, MAX_TIMESTAMP)]
Source = Annotated[str, one_of(SOURCES)]


class ClockStamp(msgspec.Struct, frozen=True, omit_defaults=True):
    """An answer's clock: when its request arrived and when it left (Unix seconds)."""

    received: Timestamp
    answered: Timestamp
    source: Source
    #: The request's nonce (with a token): proves the answer was made for that request.
    nonce: Annotated[str, matching(r"^[0-9a-f]{32}\Z", "32 hex digits")] | None = None


class ClockFacts(msgspec.Struct, frozen=True):
    """A node's clock against the master's, as it reports it: this node's minus the master's."""

    offset_s: Annotated[float, within(-MAX_OFFSET_S, MAX_OFFSET_S)]
    rtt_s: Annotated[float, within(0.0, MAX_RTT_S)]
    samples: Annotated[int, within(1, MAX_SAMPLES)]
    source: Source = "master"


#: Samples kept; the estimate is the one among them with the lowest round trip.
SAMPLES_KEPT = 8
#: Above this offset to the master a node's clock is named in the master's verdict.
CLOCK_WARN_S = 1.0
#: Stamps whose round trip comes out below this are impossible (the answer claims to have
#: been held longer than the request took): dropped, never averaged in.
RTT_SLACK_S = -0.005
#: Senders whose refused messages /status remembers at most.
REFUSALS_KEPT = 64


class Sample(msgspec.Struct, frozen=True):
    """One exchange's offset (this node's clock minus the answering clock) and round trip."""

    offset_s: float
    rtt_s: float
    source: str = "master"


def sample(t1: float, t2: float, t3: float, t4: float, source: str = "master") -> Sample | None:
    """The offset and round trip of one exchange; None when the stamps cannot be true."""
    theta = ((t2 - t1) + (t3 - t4)) / 2
    rtt = (t4 - t1) - (t3 - t2)
    if rtt < RTT_SLACK_S:
        return None
    return Sample(offset_s=-theta, rtt_s=max(rtt, 0.0), source=source)


class ClockEstimate:
    """This node's offset to the master, from the best of its last few samples."""

    def __init__(
        self, wall: Callable[[], float], *, on_change: Callable[[float], None] | None = None
    ) -> None:
        self._wall = wall
        self._on_change = on_change
        #: True on the master: it is the clock every other node measures against.
        self.reference = False
        self._samples: deque[Sample] = deque(maxlen=SAMPLES_KEPT)
        self._best: Sample | None = None
        #: Samples taken since start.
        self.count = 0
        #: Sender -> its clock minus ours, for the last message refused as stale from it.
        self.refusals: dict[str, float] = {}

    def wall(self) -> float:
        """This node's own wall clock (Unix seconds), uncorrected."""
        return self._wall()

    def now(self) -> float:
        """The master's clock as this node estimates it (the wall clock on the master)."""
        return self._wall() - self.offset_s

    @property
    def offset_s(self) -> float:
        """This node's clock minus the master's; 0.0 on the master or before any sample."""
        best = self._best
        return 0.0 if best is None or self.reference else best.offset_s

    @property
    def best(self) -> Sample | None:
        """The lowest-round-trip sample of the last few, None before the first."""
        return None if self.reference else self._best

    def add(self, new: Sample, *, restart: bool = False) -> None:
        """Take a sample (ignored on the master); ``restart``: it proves the clock stepped
        (a message was refused for its timestamp), so the samples before it are void."""
        if self.reference:
            return
        if restart:
            self._samples.clear()
        self._samples.append(new)
        self.count += 1
        self._best = min(self._samples, key=lambda s: s.rtt_s)
        if self._on_change is not None:
            self._on_change(self.offset_s)

    def stamp(self, received: float, nonce: str | None) -> ClockStamp | None:
        """This node's clock for an answer to a request received at ``received`` (from now()):
        the master's own, a relay's once corrected, else None (a relay that measured nothing)."""
        if not self.reference and self._best is None:
            return None
        answered = max(self.now(), received)
        return ClockStamp(received, answered, "master" if self.reference else "relay", nonce)

    def facts(self) -> ClockFacts | None:
        """What a report tells the master of this node's clock; None before any sample."""
        best = self.best
        if best is None:
            return None
        return ClockFacts(round(best.offset_s, 6), round(best.rtt_s, 6), self.count, best.source)

    def refused(self, sender: str, skew_s: float) -> None:
        """A message from ``sender`` was refused as stale: its clock was ``skew_s`` ahead."""
        self.refusals.pop(sender, None)
        self.refusals[sender] = skew_s
        while len(self.refusals) > REFUSALS_KEPT:
            del self.refusals[next(iter(self.refusals))]

    def status(self) -> dict[str, object]:
        """The /status "clock" section."""
        best = self.best
        return {
            "reference": self.reference,
            "offset_s": None if best is None and not self.reference else round(self.offset_s, 6),
            "rtt_s": None if best is None else round(best.rtt_s, 6),
            "samples": self.count,
            "source": "self" if self.reference else (None if best is None else best.source),
            "refused": {sender: round(s, 3) for sender, s in self.refusals.items()},
        }


def direction(skew_s: float) -> str:
    """``|skew_s|`` with "ahead of" or "behind": "600 s ahead of"."""
    return f"{abs(skew_s):.0f} s {'ahead of' if skew_s >= 0 else 'behind'}"


def warning(host: str, facts: ClockFacts) -> str:
    """The master's verdict warning for a node whose clock is CLOCK_WARN_S or more off."""
    way = "ahead of" if facts.offset_s >= 0 else "behind"
    via = " through its relay" if facts.source == "relay" else ""
    return (
        f"{host}'s clock is {abs(facts.offset_s):.1f} s {way} the master's (measured{via} over "
        f"a {facts.rtt_s * 1000:.1f} ms round trip): torch, TF and JAX do not need synchronised "
        "clocks, but logs and certificates do: run NTP on every node"
    )


def skew_reason(
    master: str, skew_s: float, limit_s: float, facts: ClockFacts | None, *, by_peer: bool = True
) -> Reason:
    """Not ready because the master refused this node's messages for their timestamps (or, not
    ``by_peer``, this node refused the master's); ``skew_s``: this node's clock minus its."""
    measured = (
        "no offset it could trust came with the refusal"
        if facts is None
        else f"measured over a {facts.rtt_s * 1000:.1f} ms round trip, this node is "
        f"{facts.offset_s:+.1f} s off the master"
    )
    what = (
        f"the master {master} refused this node's messages as {direction(skew_s)} its clock"
        if by_peer
        else f"this node refused the master {master}'s messages: its clock is "
        f"{direction(-skew_s)} this node's"
    )
    return Reason(
        "clock_skew",
        f"{what} (limit {limit_s:g} s; {measured}): run NTP on every node, or give every node "
        "the same rallypoint version (it corrects for the offset)",
        host=master,
        detail=f"{skew_s:+.1f}",
    )


def refused_reason(host: str, rank: int, skew_s: float, limit_s: float) -> Reason:
    """The master's reason for a node whose join it refused for its timestamp."""
    return Reason(
        "clock_skew",
        f"{host} has not joined: its messages are {direction(skew_s)} this node's clock "
        f"(limit {limit_s:g} s), so they are refused as stale; a node of this rallypoint "
        "version measures the offset and corrects for it: run NTP on every node, or give "
        f"{host} the same rallypoint version",
        host=host,
        detail=f"{skew_s:+.1f}",
        ranks=(rank,),
    )


def sender_host(body: bytes, spec: ClusterSpec) -> str | None:
    """The spec host that sent a join, report or relay batch ``body``, None if it names none
    (called only for bodies whose signature checked out)."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    host, relay = data.get("host"), data.get("relay")
    if isinstance(relay, int) and not isinstance(relay, bool) and 0 <= relay < len(spec.hosts):
        return spec.hosts[relay]  # a relay's batch: signed, and timed, by the relay
    if isinstance(host, str):
        wanted = host.lower()
        return next((h for h in spec.hosts if h.lower() == wanted), None)
    return None
