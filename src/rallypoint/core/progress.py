"""Each node's last progress mark, and whether one node's progress clearly stopped first (pure).

`rallypoint run` reads its job's progress file (cli/progressfile.py) and tells its sidecar
each new mark, at most once a second. The sidecars carry the marks up on the keep-alives
(rendezvous/afterready/progresswatch.py): a worker its own, a relay its group's that changed. The
master holds every node's. Every answer carries a summary of constant size (how many nodes
marked, the two oldest marks and the newest), so every node can say which node is behind
without a table of N marks on each keep-alive.

Marks are stamped on the master's clock. A node at an earlier step than every other is
behind whatever the clocks say. At the same step, the oldest mark stands out only when it is
older than the next one by more than (a) the two nodes' clock uncertainty (each mark carries
half the round trip of its node's best clock sample), plus (b) how far the other nodes' last
marks spread among themselves, and by at least (c) half a phase of the job (the time between
the next node's last two marks): every rank of a synchronous job that stopped in the same
collective marked it within a moment of the others, and which of them was a millisecond
first says nothing. Otherwise, and while some node's mark is not known, the line says that
it cannot be told.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Annotated

import msgspec

from rallypoint.core.jobs import Attempt, Time
from rallypoint.model import Nodes, Rank, at_most, matching, within

#: The word of phase a job may write after its step (cli/progressfile.py reads the same).
PHASE_PATTERN = r"[A-Za-z0-9_.-]{1,32}"
Step = Annotated[int, within(0, 10**18 - 1)]
Phase = Annotated[str, matching(rf"^(?:{PHASE_PATTERN})?\Z", "one word of letters, digits, _ . -")]
LocalRank = Annotated[int, within(0, 1023)]
#: A clock's uncertainty in seconds (half a round trip), at most an hour.
Uncertainty = Annotated[float, within(0.0, 3600.0)]
#: Seconds between two marks, at most about a year.
MAX_PERIOD_S = 3.2e7
Period = Annotated[float, within(0.0, MAX_PERIOD_S)]


class Mark(msgspec.Struct, frozen=True, omit_defaults=True):
    """One node's last progress: when (the master's clock), the step and phase it wrote, and
    which local rank it was (the oldest of the node's, when each local rank marks its own)."""

    rank: Rank
    attempt: Attempt
    at: Time
    step: Step | None = None
    phase: Phase = ""
    local_rank: LocalRank | None = None
    #: How far off ``at`` may be from the master's clock (half a clock round trip).
    error_s: Uncertainty = 0.0
    #: Seconds from the node's mark before this one to this one (None: its first), as `run`
    #: saw them: the length of the job's phase.
    period_s: Period | None = None


class Summary(msgspec.Struct, frozen=True, omit_defaults=True):
    """The cluster's progress in constant size: how many nodes marked in ``attempt``, its
    two oldest marks (oldest first) and its newest."""

    attempt: Attempt
    marked: Nodes
    oldest: Annotated[tuple[Mark, ...], at_most(2)] = ()
    newest: Mark | None = None


class ProgressBook:
    """The last mark of each node this node hears of (the master: all; a relay: its group;
    a worker: its own)."""

    def __init__(self) -> None:
        self.marks: dict[int, Mark] = {}

    def note(self, mark: Mark) -> bool:
        """Keep ``mark`` if it is newer than the node's known one; whether it was."""
        known = self.marks.get(mark.rank)
        if known is not None and (known.attempt, known.at) >= (mark.attempt, mark.at):
            return False
        self.marks[mark.rank] = mark
        return True

    def of(self, attempt: int) -> list[Mark]:
        """The marks of ``attempt``, by rank."""
        return sorted((m for m in self.marks.values() if m.attempt == attempt), key=_rank)

    def summary(self, attempt: int) -> Summary | None:
        """The summary of ``attempt`` (None: no node marked in it)."""
        marks = [m for m in self.marks.values() if m.attempt == attempt]
        if not marks:
            return None
        oldest = heapq.nsmallest(2, marks, key=_when)
        return Summary(attempt, len(marks), tuple(oldest), max(marks, key=_when))


def _when(mark: Mark) -> tuple[float, int]:
    return (mark.at, mark.rank)


def _rank(mark: Mark) -> int:
    return mark.rank


def where(mark: Mark) -> str:
    """Where a node was: "step 1234 (data), local rank 3", "step 12", or "a touch"."""
    return spot(mark.step, mark.phase, mark.local_rank) or "a touch"


def spot(step: int | None, phase: str, local_rank: int | None) -> str:
    """Where a job was: "step 1234 (data), local rank 3", "local rank 3", or ""."""
    said = "" if step is None else f"step {step}"
    if phase:
        said += f" ({phase})"
    if local_rank is not None:
        said += f"{', ' if said else ''}local rank {local_rank}"
    return said


def behind(summary: Summary | None, hosts: Sequence[str]) -> str:
    """Which node's progress stopped first, as one line, or that it cannot be told ("" with
    fewer than two nodes marked)."""
    if summary is None or len(summary.oldest) < 2:
        return ""
    if summary.marked < len(hosts):
        # A node whose mark has not arrived (or that never marks) may be the one behind.
        return (
            f"which node stopped first cannot be told: {summary.marked} of {len(hosts)} nodes'"
            " progress is known"
        )
    first, second = summary.oldest
    newest = summary.newest or second
    name = _name(first, hosts)
    if first.step is not None and second.step is not None and first.step < second.step:
        return f"{name} is behind: its last progress was {where(first)}, every other node's later"
    gap = second.at - first.at
    bound = first.error_s + second.error_s + max(newest.at - second.at, 0.0)
    half_phase = 0.0 if second.period_s is None else second.period_s / 2
    if gap > bound and gap >= half_phase:
        return (
            f"{name} is behind: its last progress ({where(first)}) is {_ms(gap)} older than"
            " any other node's"
        )
    if gap <= bound:
        why = f"within the clocks' uncertainty and the other nodes' spread ({_ms(bound)})"
    else:
        why = f"less than half a phase of the job ({_ms(half_phase)})"
    return (
        f"which node stopped first cannot be told: the two oldest marks ({name},"
        f" {_name(second, hosts)}) are {_ms(gap)} apart, {why}; {summary.marked} nodes'"
        f" last progress spans {_ms(newest.at - first.at)}"
    )


def _name(mark: Mark, hosts: Sequence[str]) -> str:
    host = hosts[mark.rank] if mark.rank < len(hosts) else "?"
    return f"{host} (rank {mark.rank})"


def _ms(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"
