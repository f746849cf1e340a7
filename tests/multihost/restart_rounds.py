"""The campaign's restart rounds: `rallypoint run --restarts B -- steps.py --checkpoint ...`
on every node, a fault from restarted.py's kinds, every `run` to its end, and restarted.py's
checks. The sidecars are never restarted for the next round: a session that stays up must
always run again (only a node that vanished gets its sidecar back, as its container would).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

from tests.multihost import restarted
from tests.multihost.injections import MASTER
from tests.multihost.job_rounds import JOB_START_S, STEPS, job_view, served_ranks, vanish
from tests.multihost.restarted import RestartFault
from tests.support.cluster.procs import Proc

if TYPE_CHECKING:
    from tests.multihost.rounds import Campaign

#: `run --grace` (steps.py ends at once on SIGTERM).
GRACE_S = 3.0
#: The rejoin timeout of the rounds whose node comes back, and of the one whose node does not.
REJOIN_S = 60.0
REJOIN_FOR_GOOD_S = 5.0
#: Steps of a round's job, with a checkpoint after each: about 0.5 s a step.
STEPS_PER_JOB = 8
#: Steps of a restart_sidecar job: past the liveness bound after the sidecar's restart.
SIDECAR_STEPS = 24
#: How long one attempt may take to start and run, on two shared cores.
ATTEMPT_S = JOB_START_S


class RestartRound:
    """One restart round on the campaign's cluster."""

    def __init__(self, c: Campaign, number: int, kind: str) -> None:
        self.c = c
        self.number = number
        self.kind = kind
        self.runs: dict[str, list[Proc]] = {}
        self.fault = RestartFault(kind, "-", -1, 0)
        self.fault_t = 0.0
        self.argv: list[str] = []
        #: When the lost node's `run` started again (wall clock).
        self.back_at: float | None = None

    def play(self) -> None:
        c, kind = self.c, self.kind
        before = len(c.violations)
        c.job_rounds[kind] += 1
        if c.watch.wait_converged(time.monotonic(), c.options.convergence_s) is None:
            c.violate("convergence", "-", f"round {self.number}: not converged before the job")
        self.argv = self.plan()
        self.runs = {name: [c.cluster[name].spawn(self.argv, label="run")] for name in c.hosts}
        self.fault_t = time.monotonic()
        if self.past_first_steps():
            self.inject()
            self.judge()
        else:
            c.violate(
                "job",
                "-",
                f"round {self.number} ({kind}): not every rank past its "
                f"first step within {ATTEMPT_S:g} s: {self.tails()}",
            )
        for procs in self.runs.values():
            for proc in procs:
                proc.kill()
        heal_t = time.monotonic()
        if kind == "restart_lost_for_good":
            c.cluster[self.fault.target].link_up()
            c.watch.start(self.fault.target)
        took = c.settle(self.number, kind, heal_t, "job")
        c.rounds_done = self.number
        self.report(before, heal_t, took)

    def plan(self) -> list[str]:
        """The target, the fault and the budget; the `run` command line every node starts."""
        c, kind, rng = self.c, self.kind, self.c.rng
        ranks = served_ranks(c)
        target = rng.choice(c.hosts)
        rank = ranks[target]
        budget = restarted.FAULTS[kind] + rng.randint(0, 1) if kind != "restart_sidecar" else 1
        checkpoint = c.workdir / "checkpoints" / f"round{self.number}-rank{{rank}}.step"
        checkpoint.parent.mkdir(exist_ok=True)
        steps = SIDECAR_STEPS if kind == "restart_sidecar" else STEPS_PER_JOB
        job = [
            "--mib",
            "4",
            "--timeout",
            "300",
            "--compute-s",
            "0.3",
            "--steps",
            str(steps),
            "--checkpoint",
            str(checkpoint),
        ]
        second = None
        go = (job_view(c, MASTER) or {}).get("attempt")
        base = go + 1 if isinstance(go, int) else 0  # attempts go on from the cluster's last
        if kind in ("restart_crash", "restart_crash_twice"):
            job += ["--fail", f"{base}:{rank}:{rng.randint(1, 3)}:{rng.randint(1, 125)}"]
        if kind == "restart_crash_twice":
            second = rng.choice([r for r in ranks.values() if r != rank])
            job += ["--fail", f"{base + 1}:{second}:-1:{rng.randint(1, 125)}"]  # at its launch
        rejoin = REJOIN_FOR_GOOD_S if kind == "restart_lost_for_good" else REJOIN_S
        second_host = None if second is None else next(n for n, r in ranks.items() if r == second)
        self.fault = RestartFault(kind, target, rank, budget, base=base, second=second_host)
        return [
            sys.executable,
            "-m",
            "rallypoint",
            "run",
            "--quiet",
            "--timeout",
            "60",
            "--restarts",
            str(budget),
            "--rejoin-timeout",
            f"{rejoin:g}",
            "--grace",
            f"{GRACE_S:g}",
            "--",
            sys.executable,
            str(STEPS),
            *job,
        ]

    def inject(self) -> None:
        c, kind, target = self.c, self.kind, self.fault.target
        if kind in ("restart_lost_back", "restart_lost_for_good"):
            self.fault_t = time.monotonic()
            vanish(c, target)
        if kind == "restart_lost_back":
            time.sleep(c.rng.uniform(3.0, 10.0))  # its container restarted by the orchestrator
            c.cluster[target].link_up()
            c.watch.start(target)
            self.runs[target].append(c.cluster[target].spawn(self.argv, label="run-again"))
            self.back_at = time.time()
        elif kind == "restart_sidecar":
            self.fault_t = time.monotonic()
            c.watch.kill(target)
            time.sleep(c.rng.uniform(0.5, 2.0))
            c.watch.start(target)

    def judge(self) -> None:
        c, kind = self.c, self.kind
        attempts = restarted.FAULTS[kind] + 1
        bound = attempts * (ATTEMPT_S + GRACE_S) + c.lost_bound_s + REJOIN_S
        deadline = time.monotonic() + bound
        for procs in self.runs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[-1].wait(max(0.1, deadline - time.monotonic()))
        logs = {name: self.node_run(name) for name in c.hosts}
        views = {
            name: earlier(c, name)
            for name in c.hosts
            if not (kind == "restart_lost_for_good" and name == self.fault.target)
        }
        c.violations.extend(restarted.check(self.fault, logs, views, time.monotonic()))
        since = self.back_at
        if kind in ("restart_crash", "restart_crash_twice"):
            first = logs[self.fault.target].attempt(self.fault.base)
            since = None if first is None else first.failed_at
        took = (
            None if since is None else restarted.relaunched_after(logs, self.fault.base + 1, since)
        )
        if took is not None:
            c.restart_latency.setdefault(kind, []).append(took)
        if any(log.status != 0 for log in logs.values()) and kind != "restart_lost_for_good":
            return
        c.restart_rounds_completed += kind != "restart_lost_for_good"

    def past_first_steps(self) -> bool:
        """Whether every node's attempt 0 got past its first step within ATTEMPT_S."""
        deadline = time.monotonic() + ATTEMPT_S
        while time.monotonic() < deadline:
            runs = [restarted.parse(n, None, [p[0].log()]) for n, p in self.runs.items()]
            if all(r.attempts and r.attempts[0].steps >= 2 for r in runs):
                return True
            if any(p[0].returncode is not None for p in self.runs.values()):
                return False
            time.sleep(0.2)
        return False

    def node_run(self, name: str) -> restarted.NodeRun:
        procs = self.runs[name]
        return restarted.parse(name, procs[-1].returncode, [p.log() for p in procs])

    def tails(self) -> str:
        return " | ".join(
            f"{name} (rc {p[-1].returncode}): {p[-1].log()[-400:].strip()}"
            for name, p in self.runs.items()
        )

    def report(self, before: int, heal_t: float, took: float | None) -> None:
        c, fault = self.c, self.fault
        logs = {name: self.node_run(name) for name in c.hosts}
        shown = "-" if took is None else f"{took:.2f}s"
        attempts = "/".join(str(len(log.attempts)) for log in logs.values())
        line = (
            f"round {self.number:>4} {self.kind:<18} hit={fault.target:<16} "
            f"converged={shown:<7} violations={len(c.violations)} "
            f"exits={','.join(str(logs[n].status) for n in c.hosts)} "
            f"attempts={attempts} budget={fault.budget}"
        )
        c.log_round(
            before,
            line,
            {
                "round": self.number,
                "fault": self.kind,
                "hit": [fault.target],
                "fault_t": self.fault_t,
                "heal_t": heal_t,
                "converged_s": took,
                "budget": fault.budget,
                "exits": {n: log.status for n, log in logs.items()},
                "attempts": {n: [a.number for a in log.attempts] for n, log in logs.items()},
                "run_logs": {n: [str(p.log_path) for p in procs] for n, procs in self.runs.items()},
            },
        )


def earlier(c: Campaign, name: str) -> list[tuple[Any, ...]]:
    """A sidecar's earlier attempts' first failures from GET /job (empty when unanswered)."""
    view = job_view(c, name) or {}
    found = view.get("attempts")
    if not isinstance(found, list):
        return []
    return [
        (f.get("attempt"), f.get("host"), f.get("state"), f.get("code"))
        for f in found
        if isinstance(f, dict)
    ]
