"""The campaign's supervised-job rounds: `rallypoint run -- steps.py` on every node, a job
fault (supervised.py's kinds), every `run` to its end, and supervised.py's checks."""

from __future__ import annotations

import contextlib
import http.client
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.multihost import history, supervised
from tests.multihost.history import DOWN
from tests.multihost.injections import Injection, named_by_others
from tests.multihost.supervised import JobFault, JobVerdict, RunLog
from tests.multihost.watch import POLL_S, POLL_TIMEOUT_S
from tests.support import netns, steps
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.netio import http_get
from tests.support.cluster.procs import Proc

if TYPE_CHECKING:
    from tests.multihost.rounds import Campaign

#: How long a job may run: the plain torch job, and a supervised one nothing stops.
JOB_TIMEOUT_S = 150.0
STEPS = Path(steps.__file__)
#: Every rank of a supervised job past its first steps by then: five torch imports and
#: gloo's set-up on two shared cores.
JOB_START_S = 150.0
#: `rallypoint run --grace` in supervised rounds (steps.py ends at once on SIGTERM).
JOB_GRACE_S = 5.0
#: The compute phase of a job whose failure (or stop from outside) must stop the others:
#: longer than the bound, so the others sleep, and do not find the closed connections first.
STOP_COMPUTE_S = supervised.STOP_BOUND_S + 1.0
#: The compute phase of every other supervised job.
SHORT_COMPUTE_S = 0.5
#: Steps of a job_sidecar_restart job (the restart comes after its second).
RESTART_STEPS = 24
#: Keep-alive intervals for every sidecar to know every job that ended 0 as done.
DONE_INTERVALS = 4
#: How long a `run` may take to end after its stop's bound, before it counts as not ended.
END_SLACK_S = 30.0
#: `run --stall-timeout` of the rounds whose jobs mark progress (supervised.WATCHED): eight
#: steps of SHORT_COMPUTE_S, so that a loaded machine's slow step is no hang.
STALL_S = 6.0
#: The step whose data phase a job_stall rank hangs in (the round waits for step 1).
STALL_STEP = 3
#: A job_checkpoint save: longer than STALL_S, within --stall-timeout-checkpoint.
SAVE_S = STALL_S + 2.0
CHECKPOINT_BOUND_S = 3 * STALL_S


class JobRound:
    """One supervised-job round. The sidecars run on into the next round: `run` again on a
    session that stays up must start the next attempt (only a node that vanished gets its
    sidecar back, as its container would)."""

    def __init__(self, c: Campaign, number: int, kind: str) -> None:
        self.c = c
        self.number = number
        self.kind = kind
        self.target: str | None = None
        self.fault = JobFault(kind, None, None)
        self.compute = SHORT_COMPUTE_S
        self.gap = 0.0
        self.runs: dict[str, Proc] = {}
        self.fault_t = 0.0
        self.verdict = JobVerdict()
        self.logs: dict[str, RunLog] = {}

    def play(self) -> None:
        c = self.c
        before = len(c.violations)
        c.job_rounds[self.kind] += 1
        if c.watch.wait_converged(time.monotonic(), c.options.convergence_s) is None:
            c.violate("convergence", "-", f"round {self.number}: not converged before the job")
        argv = self.plan()
        self.runs = {name: c.cluster[name].spawn(argv, label="run") for name in c.hosts}
        self.fault_t = time.monotonic()
        # Past the first step (two with a short compute phase): gloo's mesh is up everywhere.
        started = self.wait_steps(0 if self.compute == STOP_COMPUTE_S else 1)
        if started:
            self.inject()
            self.judge()
        else:
            self.not_started()
            self.logs = {name: self.run_log(name, proc) for name, proc in self.runs.items()}
        for proc in self.runs.values():
            proc.kill()
        if self.kind == "job_lost" and started and c.options.liveness_check:
            self.check_named_lost()
        heal_t = time.monotonic()
        if self.target is not None and self.kind == "job_lost":
            c.cluster[self.target].link_up()
            c.watch.start(self.target)
        took = c.settle(self.number, self.kind, heal_t, "job")
        c.rounds_done = self.number
        self.report(before, heal_t, took)

    def plan(self) -> list[str]:
        """The target, the fault and the job's arguments; the `run` command line."""
        c, kind, rng = self.c, self.kind, self.c.rng
        ranks = served_ranks(c)
        self.target = None if kind in ("job_healthy", "job_checkpoint") else rng.choice(c.hosts)
        rank = None if self.target is None else ranks[self.target]
        self.fault = JobFault(kind, self.target, rank)
        self.compute = STOP_COMPUTE_S if kind in ("job_fail", "job_outside") else SHORT_COMPUTE_S
        job = ["--mib", "4", "--timeout", "300", "--compute-s", f"{self.compute:g}"]
        if kind == "job_fail":
            code = rng.randint(1, 125)
            code = 76 if code == supervised.LOST_EXIT_CODE else code
            job += ["--fail-rank", str(rank), "--fail-step", str(rng.randint(0, 1)),
                    "--fail-code", str(code)]  # fmt: skip
            self.fault = JobFault(kind, self.target, rank, code=code)
        elif kind == "job_healthy":
            job += ["--steps", str(rng.randint(6, 12))]
        elif kind == "job_sidecar_restart":
            # Running well past the liveness bound after the restart (about 0.65 s a step): a
            # node wrongly named lost would have stopped the others by the end.
            job += ["--steps", str(RESTART_STEPS)]
        elif kind == "job_stall":
            job += ["--stall", f"{rank}:{STALL_STEP}"]
            self.fault = JobFault(
                kind, self.target, rank, bound_s=STALL_S + supervised.STOP_BOUND_S
            )
        elif kind == "job_checkpoint":
            job += ["--steps", "6", "--slow-save", f"2:{SAVE_S:g}"]
        run = ["--grace", f"{JOB_GRACE_S:g}"]
        if kind in supervised.WATCHED:
            job += ["--progress"]
            run += ["--stall-timeout", f"{STALL_S:g}"]
            run += ["--stall-timeout-checkpoint", f"{CHECKPOINT_BOUND_S:g}"]
        self.gap = rng.uniform(0.5, 2.0)
        return [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60",
                *run, "--", sys.executable, str(STEPS), *job]  # fmt: skip

    def inject(self) -> None:
        """The job fault, once every rank is past its first steps."""
        c, kind, target, rank = self.c, self.kind, self.target, self.fault.rank
        if kind == "job_lost":
            assert target is not None
            self.fault_t = time.monotonic()
            self.fault = JobFault(kind, target, rank, at=time.time(), bound_s=c.lost_bound_s)
            vanish(c, target)
        elif kind == "job_outside":
            assert target is not None
            self.wait_new_step(self.runs[target])
            self.fault_t = time.monotonic()
            self.fault = JobFault(kind, target, rank, at=time.time())
            self.runs[target].signal(signal.SIGTERM)
        elif kind == "job_sidecar_restart":
            assert target is not None
            self.fault_t = time.monotonic()
            c.watch.kill(target)
            time.sleep(self.gap)
            c.watch.start(target)

    def judge(self) -> None:
        """Every `run` to its end (or its bound), then supervised.py's checks."""
        c, kind = self.c, self.kind
        limit = JOB_TIMEOUT_S if kind not in supervised.STOPPING else self.fault.bound_s
        self.logs = self.wait_runs(limit + END_SLACK_S)
        self.verdict = supervised.check(self.fault, self.logs, time.monotonic())
        c.violations.extend(self.verdict.violations)
        c.false_stops += self.verdict.false_stops
        c.cascaded += len(self.verdict.cascaded)
        if self.verdict.latencies:
            c.stop_latency.setdefault(kind, []).extend(self.verdict.latencies.values())
        if kind not in supervised.STOPPING and all(log.status == 0 for log in self.logs.values()):
            check_done(c, self.number, kind)

    def check_named_lost(self) -> None:
        """Every other node named the vanished one down within the liveness bound."""
        c, target = self.c, self.target
        assert target is not None
        expect = named_by_others(c.hosts, target)
        c.hold(Injection([target], expect, 0.0), self.fault_t)  # until every node named it
        found = history.detection(c.watch.since(self.fault_t), expect, self.fault_t,
                                  c.liveness_bound_s)  # fmt: skip
        c.violations.extend(found.violations)
        c.detections.extend(found.delays.values())

    def not_started(self) -> None:
        """The job never got past its first steps: stopped already (by a failure this
        session kept from before: a false stop), or it failed or hung by itself."""
        c, number, kind = self.c, self.number, self.kind
        early = [self.run_log(name, proc) for name, proc in self.runs.items()]
        stopped = [log for log in early if log.stopped]
        for log in stopped:
            c.false_stops += 1
            why = log.first.line if log.first is not None else "its job got SIGTERM"
            c.violate("false_stop", log.node, f"round {number} ({kind}): stopped before "
                      f"the fault, at its first steps: {why}")  # fmt: skip
        if not stopped:
            tails = " | ".join(f"{name} (rc {p.returncode}): {p.log()[-400:].strip()}"
                               for name, p in self.runs.items())  # fmt: skip
            c.violate("job", "-", f"round {number} ({kind}): not every rank past its first "
                      f"steps (within {JOB_START_S:g} s): {tails}")  # fmt: skip

    def report(self, before: int, heal_t: float, took: float | None) -> None:
        c, number, kind, target = self.c, self.number, self.kind, self.target
        statuses = {name: log.status for name, log in self.logs.items()}
        shown = "-" if took is None else f"{took:.2f}s"
        took_stop = [f"{v:.2f}" for v in sorted(self.verdict.latencies.values())]
        line = (f"round {number:>4} {kind:<18} hit={target or '-':<16} "
                f"converged={shown:<7} violations={len(c.violations)} "
                f"exits={','.join(str(statuses[n]) for n in c.hosts)} "
                f"stopped_after={'/'.join(took_stop) or '-'}")  # fmt: skip
        c.log_round(before, line, {
            "round": number, "fault": kind, "hit": [target] if target else [],
            "fault_t": self.fault_t, "heal_t": heal_t, "converged_s": took,
            "code": self.fault.code, "exits": statuses, "cascaded": self.verdict.cascaded,
            "stop_latency_s": self.verdict.latencies,
            "run_logs": {name: str(proc.log_path) for name, proc in self.runs.items()},
        })  # fmt: skip

    # the runs' logs -------------------------------------------------------------------------

    @staticmethod
    def run_log(name: str, proc: Proc) -> RunLog:
        return supervised.parse_run(name, proc.returncode, proc.log())

    def wait_steps(self, step: int) -> bool:
        """Whether every rank printed its ``step``-th STEP line within JOB_START_S."""
        deadline = time.monotonic() + JOB_START_S
        while time.monotonic() < deadline:
            logs = [self.run_log(name, proc) for name, proc in self.runs.items()]
            if supervised.ranks_past(logs, step):
                return True
            if any(log.status is not None and not log.steps for log in logs):
                return False  # a run that ended before its first step: nothing will come
            time.sleep(0.2)
        return False

    def wait_new_step(self, proc: Proc) -> None:
        """Until the job prints its next STEP line: every rank then begins its compute phase."""
        seen = len(self.run_log("-", proc).steps)
        deadline = time.monotonic() + STOP_COMPUTE_S + 30.0
        while time.monotonic() < deadline and len(self.run_log("-", proc).steps) <= seen:
            time.sleep(0.02)

    def wait_runs(self, timeout_s: float) -> dict[str, RunLog]:
        """Every `run`'s log once it ended, or at ``timeout_s`` (then status None)."""
        deadline = time.monotonic() + timeout_s
        for proc in self.runs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        return {name: self.run_log(name, proc) for name, proc in self.runs.items()}


def served_ranks(c: Campaign) -> dict[str, int]:
    """Every node's served RANK (its place in the served order when it serves none)."""
    latest = c.watch.latest()
    out = {}
    for name in c.hosts:
        env = latest[name].env if name in latest else None
        raw = (env or {}).get("RANK", "")
        out[name] = int(raw) if raw.isdigit() else c.ranked.index(name)
    return out


def check_done(c: Campaign, number: int, kind: str) -> None:
    """Every sidecar knows every node's job as done within DONE_INTERVALS intervals."""
    deadline = time.monotonic() + DONE_INTERVALS * c.interval_s
    while True:
        views = {name: job_view(c, name) for name in c.hosts}
        missing = supervised.not_done(views)
        if not missing:
            return
        if time.monotonic() >= deadline:
            bound = DONE_INTERVALS * c.interval_s
            c.violate("done", "-", f"round {number} ({kind}): every job ended 0, yet "
                      f"{bound:g} s later " + "; ".join(missing))  # fmt: skip
            return
        time.sleep(POLL_S)


def job_view(c: Campaign, name: str) -> dict[str, Any] | None:
    node = c.cluster[name]
    try:
        reply = http_get(node.ns, "127.0.0.1", LOCAL_PORT, "/job", timeout_s=POLL_TIMEOUT_S)
        view = reply.json()
    except (OSError, http.client.HTTPException, ValueError):
        return None
    return view if reply.status == 200 and isinstance(view, dict) else None


def vanish(c: Campaign, name: str) -> None:
    """The node vanishes mid-job: its link down first (no FIN, no RST), then every process
    of its namespace (sidecar, `run`, the job) SIGKILLed."""
    node = c.cluster[name]
    c.watch.set_state(name, DOWN)
    if node.sidecar is not None:
        c.watch.killed.add(id(node.sidecar))
    node.link_down()
    netns.kill_namespace(node.ns)
    if node.sidecar is not None:
        node.sidecar.kill()  # reaped
