"""One fault campaign: its cluster, its rounds (inject, hold, heal, check) and its summary.

The fault kinds are injections.py's, the supervised-job rounds job_rounds.py's, the
polling watch.py's and the invariants history.py's; campaign.py runs a campaign from the
command line.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.multihost import clients, history, supervised
from tests.multihost.history import UP, Usage, Violation
from tests.multihost.injections import FAULTS, MASTER, Injection, inject
from tests.multihost.job_rounds import JOB_TIMEOUT_S, JobRound
from tests.multihost.restart_rounds import RestartRound
from tests.multihost.restarted import RESTART_KINDS
from tests.multihost.supervised import JOB_KINDS
from tests.multihost.watch import POLL_S, Watch
from tests.support import allreduce
from tests.support.cluster.build import Cluster, backendai_order
from tests.support.cluster.layout import FAST_ARGS
from tests.support.cluster.procs import Proc

TOKEN = "campaign-test-secret"
INVARIANTS = ("agreement", "monotonic", "convergence", "liveness", "job", "crash", "resources",
              "api", "stop", "false_stop", "done", "complete", "overlap", "world",
              "attempt_agreement", "blame")  # fmt: skip
#: Added to a lost node's bound (liveness, then `run`'s stop) for a loaded machine.
LOST_SLACK_S = 3.0


def host_names(count: int) -> list[str]:
    """sub1, sub2, main1, sub3 ...: the master deliberately not listed first."""
    subs = [f"sub{i}" for i in range(1, count)]
    return [*subs[:2], MASTER, *subs[2:]]


@dataclass
class Options:
    rounds: int = 10
    seed: int | None = None
    faults: tuple[str, ...] = tuple(f for f in FAULTS if f != "kill_relay")
    nodes: int = 5
    relay_group: int = 0
    keepalive_s: float = 1.5
    job_every: int = 3
    convergence_s: float = 30.0
    liveness_check: bool = True
    cycle: bool = False
    supervised_every: int = 4
    jobs: tuple[str, ...] = JOB_KINDS + RESTART_KINDS
    out: Path | None = None
    keep: Path | None = None


class Campaign:
    """One cluster, its watchers, the rounds of faults and the checks over the history."""

    def __init__(self, options: Options, workdir: Path, out: Callable[[str], None]) -> None:
        self.options = options
        seed = options.seed
        self.seed = seed if seed is not None else random.SystemRandom().getrandbits(32)
        self.rng = random.Random(self.seed)
        self.workdir = workdir
        self.say = out
        self.hosts = host_names(options.nodes)
        self.ranked = backendai_order(self.hosts)
        self.cluster = Cluster(self.hosts, workdir / "cluster", sidecar_args=sidecar_args(options),
                               sidecar_env={"RALLYPOINT_TOKEN": TOKEN})  # fmt: skip
        self.watch = Watch(self.cluster, workdir / "history.jsonl")
        self.rounds_file = open(workdir / "rounds.jsonl", "a")  # noqa: SIM115 (closed in close)
        self.pending_heal: list[Callable[[], None]] = []
        self.reported_exits: set[int] = set()
        self.log_offsets: dict[Path, int] = {}
        self.agreement = history.AgreementCheck()
        self.monotonic = history.MonotonicCheck()
        self.violations: list[Violation] = []
        self.faults_run: Counter[str] = Counter()
        self.convergence: dict[str, list[float]] = {}
        self.detections: list[float] = []
        self.usage: dict[str, list[Usage]] = {}
        self.jobs_run = self.jobs_completed = self.rounds_done = self.fault_rounds = 0
        self.job_rounds: Counter[str] = Counter()
        self.false_stops = self.cascaded = self.restart_rounds_completed = 0
        self.stop_latency: dict[str, list[float]] = {}
        #: Restart rounds: from the fault (or the lost node's return) to the next attempt's
        #: child launched on every node.
        self.restart_latency: dict[str, list[float]] = {}
        self.interval_s = options.keepalive_s or 3.0
        self.down_after_s = 4 * self.interval_s
        self.liveness_bound_s = self.down_after_s + 2 * self.interval_s + 3.0
        #: A lost node: named lost after 4 intervals, heard of within one more, 1 s to stop.
        self.lost_bound_s = 5 * self.interval_s + 1.0 + LOST_SLACK_S

    def violate(self, invariant: str, node: str, detail: str) -> None:
        self.violations.append(Violation(invariant, time.monotonic(), node, detail))

    # rounds --------------------------------------------------------------------------------

    def run(self) -> None:
        self.cluster.up()
        self.watch.start_watchers()
        for name in self.hosts:
            self.watch.start(name)
        if self.watch.wait_converged(time.monotonic(), self.options.convergence_s) is None:
            self.violate("convergence", "-", "the cluster never got ready at the start")
            return
        for number in range(1, self.options.rounds + 1):
            self.round(number)
        self.violations.extend(history.growth(self.usage))

    def pick(self, number: int) -> str:
        """The next fault (the ``number``-th round's), or job fault in a supervised round."""
        every = self.options.supervised_every
        kinds, done = self.options.faults, self.fault_rounds
        if every and number % every == 0:
            kinds, done = self.options.jobs, sum(self.job_rounds.values())
        return kinds[done % len(kinds)] if self.options.cycle else self.rng.choice(kinds)

    def round(self, number: int) -> None:
        kind = self.pick(number)
        if kind in JOB_KINDS:
            JobRound(self, number, kind).play()
            return
        if kind in RESTART_KINDS:
            RestartRound(self, number, kind).play()
            return
        self.fault_rounds += 1
        before = len(self.violations)
        if self.watch.wait_converged(time.monotonic(), self.options.convergence_s) is None:
            self.violate("convergence", "-", f"round {number}: not converged before the fault")
        fault_t = time.monotonic()
        injection = inject(self, kind, number)
        self.pending_heal = injection.heal
        self.faults_run[kind] += 1
        self.hold(injection, fault_t)
        if self.options.liveness_check and injection.expect:
            found = history.detection(self.watch.since(fault_t), injection.expect, fault_t,
                                      self.liveness_bound_s)  # fmt: skip
            self.violations.extend(found.violations)
            self.detections.extend(found.delays.values())
        heal_t = time.monotonic()
        while injection.heal:
            injection.heal.pop()()
        took = self.settle(number, kind, heal_t, "heal")
        if self.options.job_every and number % self.options.job_every == 0 and took is not None:
            self.run_job(number)
        self.rounds_done = number
        shown = "-" if took is None else f"{took:.2f}s"
        line = (f"round {number:>4} {kind:<18} hit={'+'.join(injection.hit):<16} "
                f"converged={shown:<7} violations={len(self.violations)}")  # fmt: skip
        record = {"round": number, "fault": kind, "hit": injection.hit, "fault_t": fault_t,
                  "heal_t": heal_t, "converged_s": took}  # fmt: skip
        self.log_round(before, line, record)

    def hold(self, injection: Injection, fault_t: float) -> None:
        """At least the fault's hold; with pairs to name down, until named or past the bound."""
        end = fault_t + injection.min_hold_s
        if self.options.liveness_check and injection.expect:
            latest = fault_t + self.liveness_bound_s + POLL_S
            while time.monotonic() < latest:
                found = history.detection(self.watch.since(fault_t), injection.expect, fault_t,
                                          self.liveness_bound_s)  # fmt: skip
                if time.monotonic() >= end and len(found.delays) == len(injection.expect):
                    return
                if any("no liveness section" in v.detail for v in found.violations):
                    break
                time.sleep(POLL_S)
        time.sleep(max(0.0, end - time.monotonic()))

    def log_round(self, before: int, line: str, record: dict[str, Any]) -> None:
        """Print the round's line and its new violations; add it to rounds.jsonl."""
        fresh = self.violations[before:]
        self.say(line)
        self.rounds_file.write(json.dumps({**record, "violations": [str(v) for v in fresh]}) + "\n")
        self.rounds_file.flush()
        if fresh:
            for violation in fresh:
                self.say(f"  {violation}")
            self.say(f"  round {record['round']} failed: logs and history kept in {self.workdir}")

    # per-round checks -------------------------------------------------------------------------

    def settle(self, number: int, kind: str, heal_t: float, after: str) -> float | None:
        """Every node ready on one generation after the heal (or the job), then the round's
        checks; how long convergence took, None when it did not."""
        took = self.watch.wait_converged(heal_t, self.options.convergence_s)
        if took is None:
            bound = self.options.convergence_s
            self.violate("convergence", "-", f"round {number} ({kind}): not every node ready "
                         f"on one generation {bound:g} s after the {after}")  # fmt: skip
        else:
            self.convergence.setdefault(kind, []).append(took)
            if self.options.liveness_check:
                self.check_cleared(number, heal_t)
        self.check_history()
        self.check_processes(number)
        return took

    def check_cleared(self, number: int, heal_t: float) -> None:
        deadline = heal_t + self.options.convergence_s
        while history.cleared_at(self.watch.since(heal_t), self.hosts, heal_t) is None:
            if time.monotonic() >= deadline:
                latest = self.watch.latest()
                still = {n: sorted(s.down_hosts) if s.liveness is not None else "no section"
                         for n, s in latest.items()}  # fmt: skip
                bound = self.options.convergence_s
                self.violate("liveness", "-", f"round {number}: down lists not clear "
                             f"{bound:g} s after the heal: {still}")  # fmt: skip
                return
            time.sleep(POLL_S)

    def check_history(self) -> None:
        fresh = self.watch.unchecked()
        for sample in fresh:
            self.violations.extend(self.agreement.feed(sample))
            self.violations.extend(self.monotonic.feed(sample))
        self.violations.extend(history.api_failures(fresh))

    def check_processes(self, number: int) -> None:
        for node in self.cluster:
            for proc in node.procs:
                if proc.name.endswith(":sidecar"):
                    self.scan_log(node.name, proc.log_path)
                    self.check_exit(node.name, proc)
            sidecar = node.sidecar
            if sidecar is not None and sidecar.alive() and self.watch.state_of(node.name)[0] == UP:
                usage = process_usage(sidecar.pid, number)
                if usage is not None:
                    self.usage.setdefault(f"{node.name}:{sidecar.pid}", []).append(usage)

    def check_exit(self, name: str, proc: Proc) -> None:
        """A sidecar that exited without the campaign ending it crashed (reported once)."""
        code, key = proc.returncode, id(proc)
        if code is None or key in self.watch.killed or key in self.reported_exits:
            return
        self.reported_exits.add(key)
        self.violate("crash", name, f"sidecar pid {proc.pid} exited {code} "
                     f"unasked; log {proc.log_path}")  # fmt: skip

    def scan_log(self, name: str, path: Path) -> None:
        offset = self.log_offsets.get(path, 0)
        try:
            with open(path, "rb") as log:
                log.seek(offset)
                chunk = log.read()
        except FileNotFoundError:
            return
        whole = chunk.rfind(b"\n") + 1  # a line still being written is read next round
        self.log_offsets[path] = offset + whole
        for line in history.crash_lines(chunk[:whole].decode("utf-8", "replace")):
            self.violate("crash", name, f"{path.name}: {line.strip()[:300]}")

    def run_job(self, number: int) -> None:
        """The gloo all-reduce on every node with the env that node serves, sidecars running."""
        latest = self.watch.latest()
        envs = {name: latest[name].env for name in self.hosts if name in latest}
        if any(env is None for env in envs.values()) or len(envs) != len(self.hosts):
            self.violate("job", "-", f"round {number}: not every node serves an env for the job")
            return
        self.jobs_run += 1
        job = [sys.executable, allreduce.__file__, "--timeout", "30", "--mib", "4", "--steps", "5"]
        outcomes = clients.run_clients(
            [self.cluster[name] for name in envs],
            lambda node: [*job, "--env-json", json.dumps(envs[node.name])],
            timeout_s=JOB_TIMEOUT_S,
            label="torch",
        )
        failed = [
            f"{name} exit {o.code} ({o.log[-300:].strip()})"
            for name, o in outcomes.items()
            if o.code != 0 or not o.results or not all(r.get("ok") for r in o.results)
        ]
        if failed:
            self.violate("job", ",".join(envs), f"round {number}: " + "; ".join(failed))
        else:
            self.jobs_completed += 1

    # the end ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Undo whatever fault is still in force, stop the watchers, delete the cluster."""
        for step in reversed(self.pending_heal):
            with contextlib.suppress(Exception):
                step()
        self.pending_heal = []
        for node in self.cluster:
            if node.sidecar is not None:
                node.sidecar.signal(signal.SIGCONT)
        self.watch.stop_watchers()
        self.cluster.close()
        self.watch.close_history()
        self.rounds_file.close()

    def summary(self) -> dict[str, Any]:
        by_kind = Counter(v.invariant for v in self.violations)
        return {
            "seed": self.seed,
            "rounds": self.rounds_done,
            "nodes": self.hosts,
            "faults": dict(self.faults_run),
            "violations": {name: by_kind.get(name, 0) for name in INVARIANTS},
            "violation_details": [str(v) for v in self.violations[:100]],
            "convergence_s": {kind: spread(v) for kind, v in sorted(self.convergence.items())},
            "liveness_detection_s": spread(self.detections),
            "liveness_checked": self.options.liveness_check,
            "jobs": {"run": self.jobs_run, "completed": self.jobs_completed},
            "supervised": {
                "rounds": dict(self.job_rounds),
                "false_stops": self.false_stops,
                "cascaded": self.cascaded,
                "stop_latency_s": {k: spread(v) for k, v in sorted(self.stop_latency.items())},
                "bounds_s": {"failure": supervised.STOP_BOUND_S, "lost": self.lost_bound_s},
                "restarts_completed": self.restart_rounds_completed,
                "relaunched_s": {k: spread(v) for k, v in sorted(self.restart_latency.items())},
            },
            "resources": {
                key: {"first": vars(series[0]), "last": vars(series[-1])}
                for key, series in self.usage.items()
            },
            "workdir": str(self.workdir),
        }


def sidecar_args(options: Options) -> list[str]:
    """Every sidecar's flags: the fast timings, the keep-alive and the relay group."""
    args = [*FAST_ARGS]
    if options.keepalive_s > 0:
        args += ["--keepalive", f"{options.keepalive_s:g}"]
    if options.relay_group:
        args += ["--relay-group", str(options.relay_group)]
    return args


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": _round(history.percentile(values, 50)),
            "p99": _round(history.percentile(values, 99)),
            "max": _round(max(values) if values else None)}  # fmt: skip


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def process_usage(pid: int, number: int) -> Usage | None:
    """Open fds and resident memory of a live process; None once it is gone."""
    try:
        fds = sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss = next((int(line.split()[1]) for line in status.splitlines()
                if line.startswith("VmRSS:")), 0)  # fmt: skip
    return Usage(number, fds, rss)
