"""Pure: the invariants of the campaign's restart rounds, checked over what every node's
`rallypoint run --restarts` printed and what every sidecar's ``GET /job`` said after.

In a restart round every node runs ``rallypoint run --restarts B -- python steps.py`` with
a per-rank checkpoint (restart_rounds.py starts them, injects the fault and waits for every
`run` to end). steps.py prints ``LAUNCH`` when an attempt's child starts, ``START`` once it
joined the process group, then its steps; `run` prints each attempt's first failure and
``restarting: attempt N``. Nothing here touches a process or a clock: every check is
unit-tested from synthetic logs (tests/unit/test_restart_history.py).

Per kind, the fault and what it costs of the budget:

* ``restart_crash``: one rank exits non-zero in attempt 0 (one fault);
* ``restart_crash_twice``: that, and in attempt 1 another rank exits as it launches, while
  the others are still joining: a crash during the restart itself (two faults);
* ``restart_lost_back``: one node vanishes (link down, every process SIGKILLed); its link,
  sidecar and `run` come back some seconds later, within --rejoin-timeout (one fault);
* ``restart_lost_for_good``: the same node never comes back: every other node exits 75
  once --rejoin-timeout is over, and no attempt after the loss starts anywhere;
* ``restart_sidecar``: one sidecar SIGKILLed and started again mid-attempt: no fault of
  the job's, so nothing restarts (a restart would be a false stop).

The invariants, each a violation name of its own:

* ``complete``: a job whose faults are fewer than its budget ends 0 on every node, its last
  attempt done everywhere;
* ``overlap``: no attempt's child launches on any node before every child of the attempt
  before it ended on every node still up;
* ``world``: an attempt that launched anywhere launched on every node (world-size ranks),
  or its `run` there was stopped in it (a peer failed as its child launched);
* ``attempt_agreement``: every node names the same first failure for each attempt, in its
  `run`'s lines and in its sidecar's list of earlier attempts;
* ``false_stop``: no attempt is stopped or restarted without a fault.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.multihost.history import Violation

RESTART_KINDS = (
    "restart_crash",
    "restart_crash_twice",
    "restart_lost_back",
    "restart_lost_for_good",
    "restart_sidecar",
)
#: Faults of each kind that count against the budget (lost for good never completes).
FAULTS = {
    "restart_crash": 1,
    "restart_crash_twice": 2,
    "restart_lost_back": 1,
    "restart_lost_for_good": 1,
    "restart_sidecar": 0,
}
LOST_EXIT_CODE = 75

_FIRST = re.compile(
    r"^rallypoint: (?:stopping the job: )?first failure(?: in attempt (?P<attempt>\d+))?: "
    r"(?P<who>\S+ \(rank \d+\) .*?)(?:, [\d.]+ s (?:before|after) this node's stop)?"
    r"(?:; exit \d+)?$"
)
_RESTARTING = re.compile(r"^rallypoint: restarting: attempt (?P<attempt>\d+) on every node")
GAVE_UP = "rallypoint: not every node came back within --rejoin-timeout"


@dataclass
class Attempt:
    """One attempt's child on one node, as steps.py's lines tell it."""

    number: int
    launched: float
    #: When it joined the process group (START), and the step it resumed after.
    started: float | None = None
    resumed_from: int | None = None
    #: Its last line's time: its end, give or take the moment between a line and exit.
    last: float = 0.0
    steps: int = 0
    done: bool = False
    failed: bool = False
    #: Its FAIL line's time, when it failed on purpose.
    failed_at: float | None = None
    stopped: bool = False


@dataclass
class NodeRun:
    """One node's `rallypoint run` (or the runs one after another of a node that came back)."""

    node: str
    #: The last run's exit status; None when it did not end.
    status: int | None
    attempts: list[Attempt] = field(default_factory=list)
    #: attempt -> "host (rank r) what" of its first failure, as this node's run printed it.
    firsts: dict[int, str] = field(default_factory=dict)
    restarting: list[int] = field(default_factory=list)
    gave_up: bool = False

    def attempt(self, number: int) -> Attempt | None:
        return next((a for a in self.attempts if a.number == number), None)


def parse(node: str, status: int | None, texts: Iterable[str]) -> NodeRun:
    """A node's runs' logs, oldest first, as one NodeRun."""
    out = NodeRun(node, status)
    current: Attempt | None = None
    for text in texts:
        for raw in text.splitlines():
            kind, _, rest = raw.partition(" ")
            if kind in ("LAUNCH", "START", "STEP", "FAIL", "ERROR", "SIGTERM", "DONE"):
                fields = _fields(rest)
                if fields is None:
                    continue
                at = float(fields.get("at", 0.0))
                if kind == "LAUNCH":
                    current = Attempt(int(fields.get("attempt", 0)), at, last=at)
                    out.attempts.append(current)
                    continue
                if current is None:
                    continue
                current.last = max(current.last, at)
                if kind == "START":
                    current.started, current.resumed_from = at, int(fields.get("from", -1))
                current.steps += kind == "STEP"
                current.done |= kind == "DONE"
                if kind == "FAIL":
                    current.failed, current.failed_at = True, at
                current.stopped |= kind == "SIGTERM"
            elif (first := _FIRST.match(raw)) is not None:
                out.firsts.setdefault(int(first["attempt"] or 0), first["who"])
            elif (restart := _RESTARTING.match(raw)) is not None:
                out.restarting.append(int(restart["attempt"]))
            elif raw.startswith(GAVE_UP):
                out.gave_up = True
    return out


def _fields(rest: str) -> dict[str, Any] | None:
    try:
        fields = json.loads(rest)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


@dataclass(frozen=True)
class RestartFault:
    """What a restart round did: its kind, the node and rank it hit, and the budget."""

    kind: str
    target: str
    rank: int
    budget: int
    #: The session's number for the round's first attempt: `run` again on the same sidecars
    #: takes the attempt after the last one the cluster started.
    base: int = 0
    #: The node that crashed as it launched the second attempt (restart_crash_twice).
    second: str | None = None

    @property
    def restarted_sidecar(self) -> bool:
        """Whether the target's sidecar started afresh in the round (it knows less)."""
        return self.kind in ("restart_lost_back", "restart_lost_for_good", "restart_sidecar")

    def blamed(self) -> dict[int, str]:
        """Attempt -> the host its first failure must name."""
        if self.kind == "restart_sidecar":
            return {}
        named = {self.base: self.target}
        if self.second is not None:
            named[self.base + 1] = self.second
        return named


def check(
    fault: RestartFault,
    runs: Mapping[str, NodeRun],
    views: Mapping[str, Sequence[tuple[Any, ...]]],
    at: float,
) -> list[Violation]:
    """Every invariant of one restart round. ``views`` is each sidecar's list of earlier
    attempts' first failures from GET /job after the round: (attempt, host, state, code)
    tuples; the target's is left out when its sidecar started afresh in the round."""
    found: list[Violation] = []

    def violate(invariant: str, node: str, detail: str) -> None:
        found.append(Violation(invariant, at, node, f"{fault.kind} on {fault.target}: {detail}"))

    up = [n for n in runs if not (fault.kind == "restart_lost_for_good" and n == fault.target)]
    _complete(fault, runs, up, violate)
    _overlap(fault, runs, violate)
    _world(fault, runs, violate)
    _agreement(fault, runs, views, violate)
    if fault.kind == "restart_sidecar":
        for name, run in runs.items():
            if len(run.attempts) != 1 or run.restarting or any(a.stopped for a in run.attempts):
                violate(
                    "false_stop",
                    name,
                    f"attempts {[a.number for a in run.attempts]}, "
                    f"restarting {run.restarting}, with no fault of the job's",
                )
    return found


def relaunched_after(runs: Mapping[str, NodeRun], number: int, since: float) -> float | None:
    """Seconds from ``since`` until attempt ``number``'s child launched on the last node
    (None when it did not launch on every node)."""
    launches = [a.launched for run in runs.values() if (a := run.attempt(number)) is not None]
    return max(launches) - since if launches and len(launches) == len(runs) else None


def _complete(
    fault: RestartFault, runs: Mapping[str, NodeRun], up: list[str], violate: Any
) -> None:
    if fault.kind == "restart_lost_for_good":
        for name in up:
            run = runs[name]
            if run.status != LOST_EXIT_CODE or not run.gave_up:
                violate(
                    "complete",
                    name,
                    f"a node lost for good: expected exit {LOST_EXIT_CODE}"
                    f" after --rejoin-timeout, got {run.status} (gave up: {run.gave_up})",
                )
        return
    if FAULTS[fault.kind] > fault.budget:
        return
    for name in up:
        run = runs[name]
        last = run.attempts[-1] if run.attempts else None
        if run.status != 0 or last is None or not last.done:
            violate(
                "complete",
                name,
                f"{FAULTS[fault.kind]} fault(s) within --restarts "
                f"{fault.budget}, yet exit {run.status}, last attempt "
                f"{None if last is None else last.number} done: "
                f"{last is not None and last.done}",
            )
        elif last.number != fault.base + FAULTS[fault.kind]:
            violate(
                "complete",
                name,
                f"ended in attempt {last.number}, expected "
                f"{fault.base + FAULTS[fault.kind]}: one after {fault.base} per fault",
            )


def _overlap(fault: RestartFault, runs: Mapping[str, NodeRun], violate: Any) -> None:
    numbers = sorted({a.number for run in runs.values() for a in run.attempts})
    for earlier, later in itertools.pairwise(numbers):
        ends = [
            (a.last, name)
            for name, run in runs.items()
            if (a := run.attempt(earlier)) is not None
            and not (fault.kind.startswith("restart_lost") and name == fault.target)
        ]
        launches = [
            (a.launched, name)
            for name, run in runs.items()
            if (a := run.attempt(later)) is not None
        ]
        if ends and launches and min(launches)[0] <= max(ends)[0]:
            end_at, end_node = max(ends)
            launch_at, launch_node = min(launches)
            violate(
                "overlap",
                launch_node,
                f"attempt {later} launched {end_at - launch_at:.3f}"
                f" s before attempt {earlier} ended on {end_node}",
            )


def _world(fault: RestartFault, runs: Mapping[str, NodeRun], violate: Any) -> None:
    numbers = sorted({a.number for run in runs.values() for a in run.attempts})
    for number in numbers:
        # A node whose run was stopped in the attempt took part in it: its child may have
        # been stopped before its first line (a peer failed as it launched).
        missing = [
            name
            for name, run in runs.items()
            if run.attempt(number) is None and number not in run.firsts
        ]
        if missing:
            violate(
                "world",
                ",".join(missing),
                f"attempt {number} launched on {len(runs) - len(missing)} of {len(runs)} nodes",
            )
    if fault.kind == "restart_lost_for_good" and numbers and numbers[-1] > fault.base:
        violate("world", fault.target, f"attempt {numbers[-1]} launched without the lost node")


def _agreement(
    fault: RestartFault,
    runs: Mapping[str, NodeRun],
    views: Mapping[str, Sequence[tuple[Any, ...]]],
    violate: Any,
) -> None:
    blamed = fault.blamed()
    for number in sorted({k for run in runs.values() for k in run.firsts}):
        named = {name: run.firsts[number] for name, run in runs.items() if number in run.firsts}
        if len(set(named.values())) > 1:
            violate(
                "attempt_agreement",
                ",".join(named),
                f"attempt {number}'s first failure differs: {named}",
            )
        wrong = {n: who for n, who in named.items() if not who.startswith(f"{blamed.get(number)} ")}
        if wrong:
            violate(
                "attempt_agreement",
                ",".join(wrong),
                f"attempt {number}'s first failure should name {blamed.get(number)}: {wrong}",
            )
    # The round's attempts only: a sidecar restarted in an earlier round knows fewer before.
    lists = {
        name: tuple(tuple(x) for x in view if isinstance(x[0], int) and x[0] >= fault.base)
        for name, view in views.items()
    }
    if len(set(lists.values())) > 1:
        violate(
            "attempt_agreement", ",".join(lists), f"the sidecars' earlier attempts differ: {lists}"
        )
    for name, listed in lists.items():
        hosts = {x[0]: x[1] for x in listed}
        if {k: hosts.get(k) for k in blamed} != blamed:
            violate(
                "attempt_agreement",
                name,
                f"GET /job's earlier attempts {listed} should name {blamed}",
            )
