"""Pure: the invariants of the campaign's supervised-job rounds, checked over what every
node's `rallypoint run` printed.

In a supervised round every node runs ``rallypoint run -- python tests/support/steps.py``
(campaign.py starts them, injects the job fault and waits for every `run` to end); each
log holds the job's timestamped ``STEP``/``FAIL``/``SIGTERM``/``DONE`` lines and `run`'s own
``rallypoint: first failure: ...`` line. Nothing here touches a process or a clock: every
check is unit-tested from synthetic logs (tests/unit/test_campaign_history.py).

Per kind, what the campaign does and what must hold:

* ``job_fail``: one rank exits a non-zero code after its first steps. Every other node's
  job is signalled within STOP_BOUND_S of the FAIL line and its `run` exits that code.
* ``job_lost``: one node vanishes (link down, every process SIGKILLed). Every other node's
  job is signalled within the liveness bound of the kill; its `run` exits 75.
* ``job_outside``: SIGTERM to one node's `run` only. That node exits 143 (its job dies of
  the SIGTERM passed on); every other node's job is signalled within STOP_BOUND_S; exit 75.
* ``job_stall``: under ``--stall-timeout``, one rank hangs in the data phase of a step
  while the others block in its all-reduce (steps.py ``--stall``). Every node's job is
  signalled within the stall timeout and STOP_BOUND_S of the hang, every `run` exits 1 and
  names the rank that hung (its progress stopped a compute phase before the others').
* ``job_sidecar_restart``: one sidecar SIGKILLed and restarted within the liveness bound;
  ``job_healthy``: nothing; ``job_checkpoint``: every rank saves a checkpoint longer than
  ``--stall-timeout`` but within ``--stall-timeout-checkpoint``. Every node ends 0 by
  itself; a job signalled is a false stop.
  Then every sidecar must know every node's job as done (``exited 0``) within a few
  keep-alive intervals (`not_done`): a job it still thinks running is named lost when its
  node goes, and that failure, kept for the session, stops the next job at once.

In the three stopping kinds every stopped `run` names the node at fault (host and rank) as
the first failure, with the status it exited with. A job whose collective fails on a peer's
closed connection (a peer stopped first) before its own stop is *cascaded*: it ends by
itself, so its stop is timed by its ERROR line, and its `run`'s status must still be the
expected one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.multihost.history import Violation

#: The job faults of a supervised round, in the order --cycle takes them.
JOB_KINDS = (
    "job_fail", "job_lost", "job_outside", "job_sidecar_restart", "job_healthy", "job_stall",
    "job_checkpoint",
)  # fmt: skip
#: The kinds whose fault must stop every other node's job.
STOPPING = ("job_fail", "job_lost", "job_outside", "job_stall")
#: The kinds whose jobs mark their progress, under `run --stall-timeout`.
WATCHED = ("job_healthy", "job_sidecar_restart", "job_stall", "job_checkpoint")
#: `run`'s status for a stalled job (the job's own failure).
STALLED_EXIT_CODE = 1
#: `rallypoint run`'s default status for a lost node or one stopped from outside.
LOST_EXIT_CODE = 75
#: The status of a job that dies of the SIGTERM `run` passes on (steps.py: 128 + 15).
TERM_STATUS = 143
#: A failure or a stop from outside must have reached every other node's job by then
#: (two cores shared with other work; the measured figures are in docs/reliability.md).
STOP_BOUND_S = 5.0

_FIRST = re.compile(
    r"^rallypoint: first failure(?: in attempt \d+)?: "
    r"(?P<host>\S+) \(rank (?P<rank>\d+)\) (?P<what>.*?)"
    r"(?:, (?P<when>[\d.]+) s (?:before|after) this node's stop)?(?:; exit (?P<exit>\d+))?$"
)
_KINDS = ("STEP", "FAIL", "ERROR", "SIGTERM", "DONE", "STALL")
#: What `run` prints when the cluster says stop, just before it signals the job's group.
STOPPING_LINE = "rallypoint: stopping the job:"
_BEHIND = re.compile(r"^rallypoint: (?P<host>\S+) \(rank \d+\) is behind: ")


@dataclass(frozen=True)
class FirstFailure:
    """`run`'s ``rallypoint: first failure:`` line: who, what, and the status it gave."""

    host: str
    rank: int
    what: str
    #: The ``; exit N`` of a stopped `run`; None on a `run` whose own job ended.
    status: int | None
    line: str


@dataclass(frozen=True)
class RunLog:
    """One node's `rallypoint run` of steps.py, as its log and exit status tell it."""

    node: str
    #: `run`'s exit status (negative: killed by that signal); None when it did not end.
    status: int | None
    steps: tuple[float, ...] = ()
    fail_at: float | None = None
    fail_code: int | None = None
    #: When a collective of the job failed (a peer's connection closed under it).
    error_at: float | None = None
    #: When the stop reached the job (its first SIGTERM line).
    sigterm_at: float | None = None
    done_at: float | None = None
    #: When the job's rank began to hang (steps.py --stall).
    stall_at: float | None = None
    first: FirstFailure | None = None
    #: Whether `run` printed STOPPING_LINE (the cluster told it to stop the job).
    stopping: bool = False
    #: The host `run` said is behind after a stall ("HOST (rank N) is behind: ...").
    behind: str | None = None

    @property
    def stopped(self) -> bool:
        """Whether anything stopped this node's job: a SIGTERM reached it, or `run` stopped
        it, or exited with another node's failure (a job that ended by itself because of it)."""
        return (
            self.sigterm_at is not None
            or self.stopping
            or (
                self.first is not None
                and self.first.status is not None
                and self.first.host != self.node
            )
        )

    @property
    def cascaded(self) -> bool:
        """Whether the job's collective failed on a peer's closed connection before the stop
        reached it: it ends by itself, and may not say SIGTERM any more."""
        return self.error_at is not None and (
            self.sigterm_at is None or self.error_at < self.sigterm_at
        )

    @property
    def stopped_at(self) -> float | None:
        """When the job stopped working: its SIGTERM line, or its ERROR line when cascaded."""
        return self.error_at if self.cascaded else self.sigterm_at


def parse_first(line: str) -> FirstFailure | None:
    """A ``rallypoint: first failure: ...`` line of `run`'s; None for any other line."""
    match = _FIRST.match(line.strip())
    if match is None:
        return None
    status = match["exit"]
    return FirstFailure(
        match["host"], int(match["rank"]), match["what"],
        None if status is None else int(status), line.strip(),
    )  # fmt: skip


def parse_run(node: str, status: int | None, text: str) -> RunLog:
    """A node's `run` log: steps.py's stamped lines and `run`'s last first-failure line."""
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _KINDS}
    first: FirstFailure | None = None
    behind: str | None = None
    for raw in text.splitlines():
        kind, _, rest = raw.partition(" ")
        if kind in found:
            try:
                fields = json.loads(rest)
            except ValueError:
                continue
            if isinstance(fields, dict) and isinstance(fields.get("at"), int | float):
                found[kind].append(fields)
            continue
        parsed = parse_first(raw)
        if parsed is not None:
            first = parsed
        elif (named := _BEHIND.match(raw.strip())) is not None:
            behind = named["host"]
    fails, errors = found["FAIL"], found["ERROR"]
    terms, dones, stalls = found["SIGTERM"], found["DONE"], found["STALL"]
    return RunLog(
        node=node,
        status=status,
        steps=tuple(float(s["at"]) for s in found["STEP"]),
        fail_at=float(fails[0]["at"]) if fails else None,
        fail_code=fails[0].get("code") if fails else None,
        error_at=float(errors[0]["at"]) if errors else None,
        sigterm_at=float(terms[0]["at"]) if terms else None,
        done_at=float(dones[0]["at"]) if dones else None,
        stall_at=float(stalls[0]["at"]) if stalls else None,
        first=first,
        stopping=STOPPING_LINE in text,
        behind=behind,
    )


@dataclass(frozen=True)
class JobFault:
    """What a supervised round did to the job.

    ``host``/``rank``: the node at fault (none for ``job_healthy``); ``code``: the exit code
    ``job_fail`` made its rank exit; ``at``: the wall-clock time of the injection (the kill
    for ``job_lost``, the SIGTERM for ``job_outside``; ``job_fail`` is timed from its FAIL
    line); ``bound_s``: how long after that every other job may take to be signalled.
    """

    kind: str
    host: str | None = None
    rank: int | None = None
    code: int | None = None
    at: float | None = None
    bound_s: float = STOP_BOUND_S
    lost_code: int = LOST_EXIT_CODE


@dataclass
class JobVerdict:
    """A supervised round checked: its violations, each stopped node's stop latency (from
    the failure to its job's SIGTERM line), and how many healthy jobs were stopped."""

    violations: list[Violation] = field(default_factory=list)
    latencies: dict[str, float] = field(default_factory=dict)
    false_stops: int = 0
    #: Stopped nodes whose job's collective failed before the stop reached it (`cascaded`).
    cascaded: list[str] = field(default_factory=list)


def expected_status(fault: JobFault) -> int | None:
    """The status every other node's `run` must exit with; None when nobody is stopped."""
    if fault.kind == "job_fail":
        return fault.code
    if fault.kind == "job_stall":
        return STALLED_EXIT_CODE
    if fault.kind in ("job_lost", "job_outside"):
        return fault.lost_code
    return None


def check(fault: JobFault, runs: Mapping[str, RunLog], t: float = 0.0) -> JobVerdict:
    """The invariants of one supervised round over every node's `run` (``t``: the time the
    violations carry)."""
    verdict = JobVerdict()

    def violate(invariant: str, node: str, detail: str) -> None:
        verdict.violations.append(Violation(invariant, t, node, f"{fault.kind}: {detail}"))

    if fault.kind not in STOPPING:
        # A job that failed by itself (a crash at exit, say) is a failure like any other:
        # the stops it causes are no false stops.
        failed = {n for n, r in runs.items() if not r.stopped and r.status not in (0, None)}
        for run in runs.values():
            _healthy(run, violate, verdict, failed)
        return verdict
    culprit = runs.get(fault.host or "")
    origin = fault.at
    if fault.kind == "job_fail":
        origin = None if culprit is None else culprit.fail_at
        if culprit is None or culprit.fail_at is None:
            violate("job", fault.host or "-", "no FAIL line from the rank told to fail")
        elif culprit.status != fault.code:
            violate("stop", culprit.node, f"failed with {fault.code} but its run exited "
                    f"{_shown(culprit.status)}")  # fmt: skip
    elif fault.kind == "job_stall":
        origin = None if culprit is None else culprit.stall_at
        if culprit is None or culprit.stall_at is None:
            violate("job", fault.host or "-", "no STALL line from the rank told to hang")
        elif culprit.status != STALLED_EXIT_CODE or culprit.first is None:
            violate("stop", culprit.node, f"hung, but its run exited {_shown(culprit.status)}"
                    f" (not {STALLED_EXIT_CODE}) or named nothing")  # fmt: skip
        elif culprit.first.host != culprit.node:
            violate("stop", culprit.node, f"hung, but names another: {culprit.first.line}")
        else:
            for run in runs.values():
                if run.status is not None and run.behind != culprit.node:
                    violate("blame", run.node, f"says {run.behind} is behind, not {culprit.node}")
    elif fault.kind == "job_outside" and culprit is not None and culprit.status != TERM_STATUS:
        violate("stop", culprit.node, f"its run, stopped from outside by SIGTERM, exited "
                f"{_shown(culprit.status)}, not {TERM_STATUS}")  # fmt: skip
    want = expected_status(fault)
    for name, run in runs.items():
        if name == fault.host:
            continue
        if run.status is None:
            violate("stop", name, "its run did not end")
        elif run.status != want:
            said = f" ({run.first.line})" if run.first is not None else ""
            if run.cascaded:
                said += " after its collective failed on a peer's closed connection"
            violate("stop", name, f"its run exited {_shown(run.status)}, not {want}{said}")
        if run.cascaded:
            verdict.cascaded.append(name)
        stopped = run.stopped_at
        if stopped is None:
            violate("stop", name, "its job was never signalled")
        elif origin is not None:
            took = stopped - origin
            verdict.latencies[name] = took
            if took > fault.bound_s:
                violate("stop", name, f"its job was stopped {took:.2f} s after the failure "
                        f"of {fault.host} (bound {fault.bound_s:g} s)")  # fmt: skip
        first = run.first
        if first is None or first.status is None:
            violate("stop", name, "its run named no first failure")
        elif first.host != fault.host or fault.rank not in (None, first.rank):
            violate("stop", name, f"names {first.host} (rank {first.rank}) first, not "
                    f"{fault.host} (rank {fault.rank}): {first.line}")  # fmt: skip
        elif first.status != run.status:
            violate("stop", name, f"its line says exit {first.status}, it exited "
                    f"{_shown(run.status)}: {first.line}")  # fmt: skip
    named = {(r.first.host, r.first.rank) for n, r in runs.items()
             if n != fault.host and r.first is not None and r.first.status is not None}  # fmt: skip
    if len(named) > 1:
        violate("stop", "-", f"the stopped nodes name different first failures: {sorted(named)}")
    return verdict


def _healthy(
    run: RunLog,
    violate: Callable[[str, str, str], None],
    verdict: JobVerdict,
    failed: set[str],
) -> None:
    """No fault that stops anything: the job must end 0 by itself, unsignalled (unless a
    job of ``failed`` failed by itself and this run names it first)."""
    if run.stopped and run.first is not None and run.first.host in failed:
        return
    if run.stopped:
        verdict.false_stops += 1
        why = run.first.line if run.first is not None else "its job got SIGTERM"
        violate("false_stop", run.node, f"a healthy job was stopped (exit "
                f"{_shown(run.status)}): {why}")  # fmt: skip
    elif run.status is None:
        violate("job", run.node, "its run did not end")
    elif run.status != 0 or run.done_at is None:
        violate("job", run.node, f"its run exited {run.status}"
                + ("" if run.done_at is not None else " without a DONE line"))  # fmt: skip


def _shown(status: int | None) -> str:
    if status is None:
        return "nothing (still running)"
    return f"{status} (killed by signal {-status})" if status < 0 else str(status)


def not_done(views: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """After every node's job ended 0: what each sidecar's ``GET /job`` (node -> answer, None
    when it did not answer) still shows as not done. A node kept as ``running`` there is
    named lost when it goes (its node leaves, a partition) and stops the next job."""
    out = []
    for observer, view in views.items():
        if view is None:
            out.append(f"{observer}: no answer from GET /job")
            continue
        table = view.get("nodes") or []
        seen = {str(job.get("host")): job for job in table if isinstance(job, Mapping)}
        for host in views:
            job = seen.get(host)
            if job is None or job.get("state") != "exited" or job.get("code") != 0:
                state = "nothing" if job is None else job.get("what") or job.get("state")
                out.append(f"{observer} shows {host}'s job as {state}")
    return out


def ranks_past(runs: Iterable[RunLog], step: int) -> bool:
    """Whether every run's job printed at least ``step + 1`` STEP lines (step is 0-based)."""
    return all(len(run.steps) > step for run in runs)
