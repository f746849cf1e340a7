"""A randomized fault campaign on a namespace cluster: inject, hold, heal, check, repeat.

    python -m tests.multihost.campaign --rounds 200 --seed 12345 \\
        --faults kill_worker,pause_master --nodes 5 --out results.json --keep DIR

Every node's local API is polled for the whole run (`Watcher`); the invariants over that
history are history.py's. Every ``--supervised-every``-th round is a supervised-job round
instead: `rallypoint run -- steps.py` on every node, a job fault (supervised.py's kinds),
and supervised.py's checks over what every `run` printed. The seed is printed first and
picks every fault, target and hold, so a run can be replayed. Exit code 1 when any
invariant was violated, 2 when the cluster cannot be built here.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.core import fanout
from tests.multihost import clients, harness, history, supervised
from tests.multihost.history import DOWN, PAUSED, STARTING, UP, Sample, Usage, Violation
from tests.multihost.supervised import JOB_KINDS, JobFault, JobVerdict, RunLog
from tests.support import allreduce, netns, steps

#: The --long-poll of harness.FAST_ARGS.
LONG_POLL_S = 5.0
TOKEN = "campaign-test-secret"
MASTER = "main1"
POLL_S = 0.25
#: Generous for one local request: two cores are shared with torch jobs and other work.
POLL_TIMEOUT_S = 5.0
JOB_TIMEOUT_S = 150.0
INVARIANTS = ("agreement", "monotonic", "convergence", "liveness", "job", "crash", "resources",
              "api", "stop", "false_stop", "done")  # fmt: skip
#: Faults after which a node is dead, paused or cut off: the others must name it down.
FAULTS = (
    "kill_worker", "kill_master", "kill_master_mid", "kill_worker_mid", "pause_master",
    "pause_worker", "readdress_worker", "isolate_one", "halves", "oneway_loss",
    "drop_join_answers", "name_vanish", "kill_all", "kill_relay",
)  # fmt: skip
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
#: Added to a lost node's bound (liveness, then `run`'s stop) for a loaded machine.
LOST_SLACK_S = 3.0
#: Keep-alive intervals for every sidecar to know every job that ended 0 as done.
DONE_INTERVALS = 4
#: How long a `run` may take to end after its stop's bound, before it counts as not ended.
END_SLACK_S = 30.0


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
    jobs: tuple[str, ...] = JOB_KINDS
    out: Path | None = None
    keep: Path | None = None


@dataclass
class Injection:
    """What a fault did: the nodes hit, the (observer, host) pairs that must name a node
    down, the shortest hold, and the steps that heal it (run in reverse order)."""

    hit: list[str]
    expect: list[tuple[str, str]] = field(default_factory=list)
    min_hold_s: float = 1.0
    heal: list[Callable[[], None]] = field(default_factory=list)


class Watcher(threading.Thread):
    """Polls one node's /env and /status every POLL_S until stopped; every answer a Sample."""

    def __init__(self, campaign: Campaign, node: harness.Node) -> None:
        super().__init__(name=f"watch-{node.name}", daemon=True)
        self.campaign = campaign
        self.node = node
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            state, version = self.campaign.state_of(self.node.name)
            sample = self.poll(state)
            self.campaign.record(sample, version)
            self.stopping.wait(max(0.0, POLL_S - (time.monotonic() - started)))

    def poll(self, state: str) -> Sample:
        ns, name = self.node.ns, self.node.name
        try:
            env_reply = harness.http_get(ns, "127.0.0.1", harness.LOCAL_PORT,
                                         "/env?format=json", timeout_s=POLL_TIMEOUT_S)  # fmt: skip
            status_reply = harness.http_get(ns, "127.0.0.1", harness.LOCAL_PORT, "/status",
                                            timeout_s=POLL_TIMEOUT_S)  # fmt: skip
            status = status_reply.json()
            env = env_reply.json() if env_reply.status == 200 else None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            after, _ = self.campaign.state_of(name)
            return Sample(time.monotonic(), name, state, after, False,
                          error=f"{type(exc).__name__}: {exc}")  # fmt: skip
        after, _ = self.campaign.state_of(name)
        liveness = status.get("liveness") if isinstance(status, dict) else None
        return Sample(time.monotonic(), name, state, after, True, env is not None, env,
                      liveness if isinstance(liveness, dict) else None)  # fmt: skip


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
        self.ranked = harness.backendai_order(self.hosts)
        args = [*harness.FAST_ARGS]
        if options.keepalive_s > 0:
            args += ["--keepalive", f"{options.keepalive_s:g}"]
        if options.relay_group:
            args += ["--relay-group", str(options.relay_group)]
        self.cluster = harness.Cluster(self.hosts, workdir / "cluster", sidecar_args=args,
                                       sidecar_env={"RALLYPOINT_TOKEN": TOKEN})  # fmt: skip
        self.lock = threading.Lock()
        self.samples: list[Sample] = []
        self.history_file = open(workdir / "history.jsonl", "a")  # noqa: SIM115 (closed in close)
        self.rounds_file = open(workdir / "rounds.jsonl", "a")  # noqa: SIM115
        self._state: dict[str, tuple[str, int]] = {name: (DOWN, 0) for name in self.hosts}
        self.watchers: list[Watcher] = []
        self.pending_heal: list[Callable[[], None]] = []
        self.killed: set[int] = set()  # id() of every sidecar Proc the campaign ended
        self.reported_exits: set[int] = set()
        self.log_offsets: dict[Path, int] = {}
        self.agreement = history.AgreementCheck()
        self.monotonic = history.MonotonicCheck()
        self.checked = 0
        self.violations: list[Violation] = []
        self.faults_run: Counter[str] = Counter()
        self.convergence: dict[str, list[float]] = {}
        self.detections: list[float] = []
        self.usage: dict[str, list[Usage]] = {}
        self.jobs_run = 0
        self.jobs_completed = 0
        self.rounds_done = 0
        self.fault_rounds = 0
        self.job_rounds: Counter[str] = Counter()
        self.false_stops = 0
        self.cascaded = 0
        self.stop_latency: dict[str, list[float]] = {}
        interval = options.keepalive_s or 3.0
        self.interval_s = interval
        self.down_after_s = 4 * interval
        self.liveness_bound_s = self.down_after_s + 2 * interval + 3.0
        #: A lost node: named lost after 4 intervals, heard of within one more, 1 s to stop.
        self.lost_bound_s = 5 * interval + 1.0 + LOST_SLACK_S

    # sidecar states -----------------------------------------------------------------------

    def state_of(self, name: str) -> tuple[str, int]:
        with self.lock:
            return self._state[name]

    def _set_state(self, name: str, state: str) -> None:
        with self.lock:
            self._state[name] = (state, self._state[name][1] + 1)

    def record(self, sample: Sample, version: int) -> None:
        """Keep a poll; a first answer after a (re)start marks the sidecar up."""
        with self.lock:
            state, now_version = self._state[sample.node]
            if sample.answered and state == STARTING and now_version == version:
                self._state[sample.node] = (UP, version + 1)
            self.samples.append(sample)
            self.history_file.write(json.dumps(sample.to_json()) + "\n")

    def node(self, name: str) -> harness.Node:
        return self.cluster[name]

    def start(self, name: str) -> None:
        self._set_state(name, STARTING)
        self.node(name).start_sidecar()

    def kill(self, name: str) -> None:
        self._set_state(name, DOWN)
        sidecar = self.node(name).sidecar
        if sidecar is not None:
            self.killed.add(id(sidecar))
            sidecar.kill()

    def pause(self, name: str) -> None:
        self._set_state(name, PAUSED)
        sidecar = self.node(name).sidecar
        if sidecar is not None:
            sidecar.signal(signal.SIGSTOP)

    def resume(self, name: str) -> None:
        sidecar = self.node(name).sidecar
        if sidecar is not None:
            sidecar.signal(signal.SIGCONT)
        self._set_state(name, STARTING)

    # samples -------------------------------------------------------------------------------

    def since(self, t: float) -> list[Sample]:
        with self.lock:
            index = len(self.samples)
            while index > 0 and self.samples[index - 1].t >= t - 2 * POLL_TIMEOUT_S:
                index -= 1
            return [s for s in self.samples[index:] if s.t >= t]

    def latest(self) -> dict[str, Sample]:
        with self.lock:
            found: dict[str, Sample] = {}
            for sample in reversed(self.samples):
                found.setdefault(sample.node, sample)
                if len(found) == len(self.hosts):
                    break
            return found

    def wait_converged(self, after_t: float, timeout_s: float) -> float | None:
        """Seconds from after_t until every node is ready on one generation; None if never."""
        deadline = after_t + timeout_s
        while True:
            at = history.converged_at(self.since(after_t), self.hosts, after_t)
            if at is not None:
                return at - after_t
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    def violate(self, invariant: str, node: str, detail: str) -> None:
        self.violations.append(Violation(invariant, time.monotonic(), node, detail))

    # faults --------------------------------------------------------------------------------

    def workers(self) -> list[str]:
        return [name for name in self.hosts if name != MASTER]

    def relays(self) -> list[str]:
        """Workers that relay for a non-empty group (core/fanout.py), by name."""
        size = fanout.group_size(len(self.hosts), self.options.relay_group)
        n = len(self.hosts)
        return [self.ranked[r] for r in fanout.relays(size, n) if fanout.group(r, size, n)]

    def upstream_relay(self, name: str) -> str | None:
        size = fanout.group_size(len(self.hosts), self.options.relay_group)
        relay = fanout.relay_of(self.ranked.index(name), size)
        return None if relay is None else self.ranked[relay]

    def named_by_others(self, target: str) -> list[tuple[str, str]]:
        return [(other, target) for other in self.hosts if other != target]

    def iptables(self, name: str, rule: Sequence[str]) -> Callable[[], None]:
        """Insert an iptables rule in a node's namespace; return what deletes it."""
        node = self.node(name)
        node.inside(["iptables", "-w", "5", "-I", *rule])
        return lambda: node.inside(["iptables", "-w", "5", "-D", *rule])

    def drop_from(self, name: str, source: str) -> Callable[[], None]:
        """Drop everything ``name`` receives from ``source``; return what undoes it."""
        return self.iptables(name, ["INPUT", "-s", self.node(source).address, "-j", "DROP"])

    def restart_later(self, name: str) -> Callable[[], None]:
        return lambda: self.start(name)

    def inject(self, kind: str, number: int) -> Injection:
        rng = self.rng
        if kind in ("kill_worker", "kill_master", "kill_relay"):
            pool = {"kill_worker": self.workers(), "kill_master": [MASTER],
                    "kill_relay": self.relays()}[kind]  # fmt: skip
            target = rng.choice(pool)
            self.kill(target)
            return Injection([target], self.named_by_others(target), rng.uniform(1.0, 3.0),
                             [self.restart_later(target)])  # fmt: skip
        if kind in ("pause_master", "pause_worker"):
            target = MASTER if kind == "pause_master" else rng.choice(self.workers())
            self.pause(target)
            hold = max(LONG_POLL_S, self.down_after_s) + 1.0
            return Injection([target], self.named_by_others(target), hold,
                             [lambda: self.resume(target)])  # fmt: skip
        if kind == "kill_master_mid":
            for name in self.hosts:
                self.kill(name)
            for name in self.hosts:
                self.start(name)
            time.sleep(rng.uniform(0.1, 1.5))
            self.kill(MASTER)
            return Injection([MASTER], [], rng.uniform(0.5, 2.0), [self.restart_later(MASTER)])
        if kind == "kill_worker_mid":
            target = rng.choice(self.workers())
            self.kill(target)
            self.start(target)
            time.sleep(rng.uniform(0.1, 1.5))
            self.kill(target)
            return Injection([target], [], rng.uniform(0.5, 2.0), [self.restart_later(target)])
        if kind == "readdress_worker":
            target = rng.choice(self.workers())
            self.kill(target)
            self.readdress(target, number)
            return Injection([target], [], rng.uniform(0.5, 2.0), [self.restart_later(target)])
        if kind == "isolate_one":
            target = rng.choice(self.hosts)
            node = self.node(target)
            node.link_down()
            expect = self.named_by_others(target)
            if target != MASTER:
                expect.append((target, MASTER))
            return Injection([target], expect, rng.uniform(1.0, 3.0), [node.link_up])
        if kind == "halves":
            others = self.workers()
            rng.shuffle(others)
            cut = rng.randint(1, len(others) - 1) if len(others) > 1 else 1
            near, far = [MASTER, *others[: cut - 1]], others[cut - 1 :]
            heal = []
            for a in near:
                for b in far:
                    heal.append(self.drop_from(a, b))
                    heal.append(self.drop_from(b, a))
            expect = [(a, b) for a in near for b in far] + [(b, MASTER) for b in far]
            return Injection(far, expect, rng.uniform(1.0, 3.0), heal)
        if kind == "oneway_loss":
            target = rng.choice(self.hosts)
            node = self.node(target)
            if rng.random() < 0.5:
                node.drop_incoming(1.0)
                return Injection([target], [], rng.uniform(2.0, 5.0), [node.undrop_incoming])
            peer = rng.choice([h for h in self.hosts if h != target])
            undo = self.drop_from(target, peer)
            return Injection([target, peer], [], rng.uniform(2.0, 5.0), [undo])
        if kind == "drop_join_answers":
            target = rng.choice(self.workers())
            self.kill(target)
            heal = []
            for source in filter(None, (MASTER, self.upstream_relay(target))):
                rule = ["INPUT", "-s", self.node(source).address, "-p", "tcp",
                        "--sport", str(harness.PEER_PORT), "-j", "DROP"]  # fmt: skip
                heal.append(self.iptables(target, rule))
            self.start(target)
            return Injection([target], [], rng.uniform(2.0, 4.0), heal)
        if kind == "name_vanish":
            target = rng.choice(self.hosts)
            for node in self.cluster:
                node.drop_host(target)
            self.kill(target)
            self.start(target)
            return Injection([target], [], rng.uniform(2.0, 4.0), [self.restore_hosts])
        if kind == "kill_all":
            for name in self.hosts:
                self.kill(name)
            order = rng.sample(self.hosts, len(self.hosts))
            gaps = [rng.uniform(0.0, 0.5) for _ in order]

            def restart_all() -> None:
                for name, gap in zip(order, gaps, strict=True):
                    self.start(name)
                    time.sleep(gap)

            return Injection(order, [], rng.uniform(0.5, 2.0), [restart_all])
        raise ValueError(f"unknown fault {kind!r}")

    def readdress(self, name: str, number: int) -> None:
        """Move a node to a free address on the bridge and tell every hosts file."""
        node = self.node(name)
        used = {n.address for n in self.cluster}
        last = 150 + number % 40
        while f"{harness.SUBNET}.{last}" in used:
            last = 150 + (last - 149) % 40
        new, old = f"{harness.SUBNET}.{last}", node.address
        # Deleting the primary address would take the new (secondary) one with it.
        node.inside(["sysctl", "-q", "-w", f"net.ipv4.conf.{netns.IFNAME}.promote_secondaries=1"])
        node.inside(["ip", "addr", "add", f"{new}/24", "dev", netns.IFNAME])
        node.inside(["ip", "addr", "del", f"{old}/24", "dev", netns.IFNAME])
        node.inside(["ip", "route", "replace", "224.0.0.0/4", "dev", netns.IFNAME])
        node.address = new
        self.restore_hosts()

    def restore_hosts(self) -> None:
        for node in self.cluster:
            node.unpin()

    def heal(self, injection: Injection) -> None:
        while injection.heal:
            step = injection.heal.pop()
            step()

    def hold(self, injection: Injection, fault_t: float) -> None:
        """At least the fault's hold; with pairs to name down, until named or past the bound."""
        end = fault_t + injection.min_hold_s
        if self.options.liveness_check and injection.expect:
            latest = fault_t + self.liveness_bound_s + POLL_S
            while time.monotonic() < latest:
                found = history.detection(self.since(fault_t), injection.expect, fault_t,
                                          self.liveness_bound_s)  # fmt: skip
                if time.monotonic() >= end and len(found.delays) == len(injection.expect):
                    return
                if any("no liveness section" in v.detail for v in found.violations):
                    break
                time.sleep(POLL_S)
        time.sleep(max(0.0, end - time.monotonic()))

    # per-round checks -------------------------------------------------------------------------

    def check_history(self) -> None:
        with self.lock:
            fresh = self.samples[self.checked :]
            self.checked = len(self.samples)
        for sample in fresh:
            self.violations.extend(self.agreement.feed(sample))
            self.violations.extend(self.monotonic.feed(sample))
        self.violations.extend(history.api_failures(fresh))

    def check_processes(self, number: int) -> None:
        for node in self.cluster:
            for proc in node.procs:
                if not proc.name.endswith(":sidecar"):
                    continue
                self.scan_log(node.name, proc.log_path)
                code = proc.returncode
                key = id(proc)
                if code is not None and key not in self.killed and key not in self.reported_exits:
                    self.reported_exits.add(key)
                    self.violate("crash", node.name, f"sidecar pid {proc.pid} exited {code} "
                                 f"unasked; log {proc.log_path}")  # fmt: skip
            sidecar = node.sidecar
            if sidecar is not None and sidecar.alive() and self.state_of(node.name)[0] == UP:
                usage = process_usage(sidecar.pid, number)
                if usage is not None:
                    self.usage.setdefault(f"{node.name}:{sidecar.pid}", []).append(usage)

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
        latest = self.latest()
        envs = {name: latest[name].env for name in self.hosts if name in latest}
        if any(env is None for env in envs.values()) or len(envs) != len(self.hosts):
            self.violate("job", "-", f"round {number}: not every node serves an env for the job")
            return
        self.jobs_run += 1
        job = [sys.executable, allreduce.__file__, "--timeout", "30", "--mib", "4", "--steps", "5"]
        outcomes = clients.run_clients(
            [self.node(name) for name in envs],
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

    # rounds --------------------------------------------------------------------------------

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
            self.job_round(number, kind)
            return
        self.fault_rounds += 1
        before = len(self.violations)
        if self.wait_converged(time.monotonic(), self.options.convergence_s) is None:
            self.violate("convergence", "-", f"round {number}: not converged before the fault")
        fault_t = time.monotonic()
        injection = self.inject(kind, number)
        self.pending_heal = injection.heal
        self.faults_run[kind] += 1
        self.hold(injection, fault_t)
        if self.options.liveness_check and injection.expect:
            found = history.detection(self.since(fault_t), injection.expect, fault_t,
                                      self.liveness_bound_s)  # fmt: skip
            self.violations.extend(found.violations)
            self.detections.extend(found.delays.values())
        heal_t = time.monotonic()
        self.heal(injection)
        took = self.settle(number, kind, heal_t, "heal")
        if self.options.job_every and number % self.options.job_every == 0 and took is not None:
            self.run_job(number)
        self.rounds_done = number
        fresh = self.violations[before:]
        shown = "-" if took is None else f"{took:.2f}s"
        self.say(f"round {number:>4} {kind:<18} hit={'+'.join(injection.hit):<16} "
                 f"converged={shown:<7} violations={len(self.violations)}")  # fmt: skip
        self.rounds_file.write(json.dumps({
            "round": number, "fault": kind, "hit": injection.hit, "fault_t": fault_t,
            "heal_t": heal_t, "converged_s": took, "violations": [str(v) for v in fresh],
        }) + "\n")  # fmt: skip
        self.rounds_file.flush()
        if fresh:
            for violation in fresh:
                self.say(f"  {violation}")
            self.say(f"  round {number} failed: logs and history kept in {self.workdir}")

    # supervised-job rounds -------------------------------------------------------------------

    def job_round(self, number: int, kind: str) -> None:
        """`rallypoint run -- steps.py` on every node, a job fault, every `run` to its end, the
        checks; then a fresh session (every sidecar restarted: they keep a failure for life)
        after a fault that stopped the job."""
        before = len(self.violations)
        self.job_rounds[kind] += 1
        if self.wait_converged(time.monotonic(), self.options.convergence_s) is None:
            self.violate("convergence", "-", f"round {number}: not converged before the job")
        ranks = self.ranks()
        rng = self.rng
        target = None if kind == "job_healthy" else rng.choice(self.hosts)
        fault = JobFault(kind, target, None if target is None else ranks[target])
        compute = STOP_COMPUTE_S if kind in ("job_fail", "job_outside") else SHORT_COMPUTE_S
        job = ["--mib", "4", "--timeout", "300", "--compute-s", f"{compute:g}"]
        if kind == "job_fail":
            code = rng.randint(1, 125)
            code = 76 if code == supervised.LOST_EXIT_CODE else code
            job += ["--fail-rank", str(fault.rank), "--fail-step", str(rng.randint(0, 1)),
                    "--fail-code", str(code)]  # fmt: skip
            fault = JobFault(kind, target, fault.rank, code=code)
        elif kind == "job_healthy":
            job += ["--steps", str(rng.randint(6, 12))]
        elif kind == "job_sidecar_restart":
            # Running well past the liveness bound after the restart (about 0.65 s a step): a
            # node wrongly named lost would have stopped the others by the end.
            job += ["--steps", str(RESTART_STEPS)]
        gap = rng.uniform(0.5, 2.0)
        argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60",
                "--grace", f"{JOB_GRACE_S:g}", "--", sys.executable, str(STEPS), *job]  # fmt: skip
        runs = {name: self.node(name).spawn(argv, label="run") for name in self.hosts}
        fault_t = time.monotonic()
        verdict = JobVerdict()
        # Past the first step (two with a short compute phase): gloo's mesh is up everywhere.
        started = self.wait_steps(runs, 0 if compute == STOP_COMPUTE_S else 1)
        if not started:
            self.not_started(number, kind, runs)
        elif kind == "job_lost":
            assert target is not None
            fault_t = time.monotonic()
            fault = JobFault(kind, target, fault.rank, at=time.time(), bound_s=self.lost_bound_s)
            self.vanish(target)
        elif kind == "job_outside":
            assert target is not None
            self.wait_new_step(runs[target])
            fault_t = time.monotonic()
            fault = JobFault(kind, target, fault.rank, at=time.time())
            runs[target].signal(signal.SIGTERM)
        elif kind == "job_sidecar_restart":
            assert target is not None
            fault_t = time.monotonic()
            self.kill(target)
            time.sleep(gap)
            self.start(target)
        if started:
            limit = JOB_TIMEOUT_S if kind not in supervised.STOPPING else fault.bound_s
            logs = self.wait_runs(runs, limit + END_SLACK_S)
            verdict = supervised.check(fault, logs, time.monotonic())
            self.violations.extend(verdict.violations)
            self.false_stops += verdict.false_stops
            self.cascaded += len(verdict.cascaded)
            if verdict.latencies:
                self.stop_latency.setdefault(kind, []).extend(verdict.latencies.values())
            if kind not in supervised.STOPPING and all(log.status == 0 for log in logs.values()):
                self.check_done(number, kind)
        else:
            logs = {name: self.run_log(name, proc) for name, proc in runs.items()}
        for proc in runs.values():
            proc.kill()
        if kind == "job_lost" and started and self.options.liveness_check:
            assert target is not None
            expect = self.named_by_others(target)
            self.hold(Injection([target], expect, 0.0), fault_t)  # until every node named it
            found = history.detection(self.since(fault_t), expect, fault_t,
                                      self.liveness_bound_s)  # fmt: skip
            self.violations.extend(found.violations)
            self.detections.extend(found.delays.values())
        heal_t = time.monotonic()
        if target is not None and kind == "job_lost":
            self.node(target).link_up()
        if kind in supervised.STOPPING or any(log.status != 0 for log in logs.values()):
            self.new_session()  # a failure is kept: the next job would be stopped at once
        took = self.settle(number, kind, heal_t, "job")
        self.rounds_done = number
        fresh = self.violations[before:]
        statuses = {name: log.status for name, log in logs.items()}
        shown = "-" if took is None else f"{took:.2f}s"
        took_stop = [f"{v:.2f}" for v in sorted(verdict.latencies.values())]
        self.say(f"round {number:>4} {kind:<18} hit={target or '-':<16} "
                 f"converged={shown:<7} violations={len(self.violations)} "
                 f"exits={','.join(str(statuses[n]) for n in self.hosts)} "
                 f"stopped_after={'/'.join(took_stop) or '-'}")  # fmt: skip
        self.rounds_file.write(json.dumps({
            "round": number, "fault": kind, "hit": [target] if target else [],
            "fault_t": fault_t, "heal_t": heal_t, "converged_s": took,
            "code": fault.code, "exits": statuses, "cascaded": verdict.cascaded,
            "stop_latency_s": verdict.latencies,
            "run_logs": {name: str(proc.log_path) for name, proc in runs.items()},
            "violations": [str(v) for v in fresh],
        }) + "\n")  # fmt: skip
        self.rounds_file.flush()
        if fresh:
            for violation in fresh:
                self.say(f"  {violation}")
            self.say(f"  round {number} failed: logs and history kept in {self.workdir}")

    def check_done(self, number: int, kind: str) -> None:
        """Every sidecar knows every node's job as done within DONE_INTERVALS intervals."""
        deadline = time.monotonic() + DONE_INTERVALS * self.interval_s
        while True:
            views = {name: self.job_view(name) for name in self.hosts}
            missing = supervised.not_done(views)
            if not missing:
                return
            if time.monotonic() >= deadline:
                bound = DONE_INTERVALS * self.interval_s
                self.violate("done", "-", f"round {number} ({kind}): every job ended 0, yet "
                             f"{bound:g} s later " + "; ".join(missing))  # fmt: skip
                return
            time.sleep(POLL_S)

    def job_view(self, name: str) -> dict[str, Any] | None:
        node = self.node(name)
        try:
            reply = harness.http_get(node.ns, "127.0.0.1", harness.LOCAL_PORT, "/job",
                                     timeout_s=POLL_TIMEOUT_S)  # fmt: skip
            view = reply.json()
        except (OSError, http.client.HTTPException, ValueError):
            return None
        return view if reply.status == 200 and isinstance(view, dict) else None

    def not_started(self, number: int, kind: str, runs: dict[str, harness.Proc]) -> None:
        """The job never got past its first steps: stopped already (by a failure this
        session kept from before: a false stop), or it failed or hung by itself."""
        early = [self.run_log(name, proc) for name, proc in runs.items()]
        stopped = [log for log in early if log.stopped]
        for log in stopped:
            self.false_stops += 1
            why = log.first.line if log.first is not None else "its job got SIGTERM"
            self.violate("false_stop", log.node, f"round {number} ({kind}): stopped before "
                         f"the fault, at its first steps: {why}")  # fmt: skip
        if not stopped:
            self.violate("job", "-", f"round {number} ({kind}): not every rank past its first "
                         f"steps (within {JOB_START_S:g} s): {self.run_tails(runs)}")  # fmt: skip

    def ranks(self) -> dict[str, int]:
        """Every node's served RANK (its place in the served order when it serves none)."""
        latest = self.latest()
        out = {}
        for name in self.hosts:
            env = latest[name].env if name in latest else None
            raw = (env or {}).get("RANK", "")
            out[name] = int(raw) if raw.isdigit() else self.ranked.index(name)
        return out

    def run_log(self, name: str, proc: harness.Proc) -> RunLog:
        return supervised.parse_run(name, proc.returncode, proc.log())

    def run_tails(self, runs: dict[str, harness.Proc]) -> str:
        return " | ".join(f"{name} (rc {p.returncode}): {p.log()[-400:].strip()}"
                          for name, p in runs.items())  # fmt: skip

    def wait_steps(self, runs: dict[str, harness.Proc], step: int) -> bool:
        """Whether every rank printed its ``step``-th STEP line within JOB_START_S."""
        deadline = time.monotonic() + JOB_START_S
        while time.monotonic() < deadline:
            logs = [self.run_log(name, proc) for name, proc in runs.items()]
            if supervised.ranks_past(logs, step):
                return True
            if any(log.status is not None and not log.steps for log in logs):
                return False  # a run that ended before its first step: nothing will come
            time.sleep(0.2)
        return False

    def wait_new_step(self, proc: harness.Proc) -> None:
        """Until the job prints its next STEP line: every rank then begins its compute phase."""
        seen = len(self.run_log("-", proc).steps)
        deadline = time.monotonic() + STOP_COMPUTE_S + 30.0
        while time.monotonic() < deadline and len(self.run_log("-", proc).steps) <= seen:
            time.sleep(0.02)

    def wait_runs(self, runs: dict[str, harness.Proc], timeout_s: float) -> dict[str, RunLog]:
        """Every `run`'s log once it ended, or at ``timeout_s`` (then status None)."""
        deadline = time.monotonic() + timeout_s
        for proc in runs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.1, deadline - time.monotonic()))
        return {name: self.run_log(name, proc) for name, proc in runs.items()}

    def vanish(self, name: str) -> None:
        """The node vanishes mid-job: its link down first (no FIN, no RST), then every process
        of its namespace (sidecar, `run`, the job) SIGKILLed."""
        node = self.node(name)
        self._set_state(name, DOWN)
        if node.sidecar is not None:
            self.killed.add(id(node.sidecar))
        node.link_down()
        pids = subprocess.run(["ip", "netns", "pids", node.ns], capture_output=True, text=True,
                              check=True).stdout.split()  # fmt: skip
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        if node.sidecar is not None:
            node.sidecar.kill()  # reaped

    def new_session(self) -> None:
        """Every sidecar killed, then every one started: no node keeps the failure."""
        for name in self.hosts:
            self.kill(name)
        for name in self.hosts:
            self.start(name)

    def settle(self, number: int, kind: str, heal_t: float, after: str) -> float | None:
        """Every node ready on one generation after the heal (or the job), then the round's
        checks; how long convergence took, None when it did not."""
        took = self.wait_converged(heal_t, self.options.convergence_s)
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
        while history.cleared_at(self.since(heal_t), self.hosts, heal_t) is None:
            if time.monotonic() >= deadline:
                latest = self.latest()
                still = {n: sorted(s.down_hosts) if s.liveness is not None else "no section"
                         for n, s in latest.items()}  # fmt: skip
                bound = self.options.convergence_s
                self.violate("liveness", "-", f"round {number}: down lists not clear "
                             f"{bound:g} s after the heal: {still}")  # fmt: skip
                return
            time.sleep(POLL_S)

    def run(self) -> None:
        self.cluster.up()
        for node in self.cluster:
            self.watchers.append(Watcher(self, node))
        for watcher in self.watchers:
            watcher.start()
        for name in self.hosts:
            self.start(name)
        if self.wait_converged(time.monotonic(), self.options.convergence_s) is None:
            self.violate("convergence", "-", "the cluster never got ready at the start")
            return
        for number in range(1, self.options.rounds + 1):
            self.round(number)
        self.violations.extend(history.growth(self.usage))

    def close(self) -> None:
        """Undo whatever fault is still in force, stop the watchers, delete the cluster."""
        for step in reversed(self.pending_heal):
            with contextlib.suppress(Exception):
                step()
        self.pending_heal = []
        for node in self.cluster:
            if node.sidecar is not None:
                node.sidecar.signal(signal.SIGCONT)
        for watcher in self.watchers:
            watcher.stopping.set()
        for watcher in self.watchers:
            watcher.join(timeout=2 * POLL_TIMEOUT_S + 1)
        self.cluster.close()
        with self.lock:
            self.history_file.close()
        self.rounds_file.close()

    # results -------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        def spread(values: Sequence[float]) -> dict[str, Any]:
            return {"n": len(values), "p50": _round(history.percentile(values, 50)),
                    "p99": _round(history.percentile(values, 99)),
                    "max": _round(max(values) if values else None)}  # fmt: skip

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
            },
            "resources": {
                key: {"first": vars(series[0]), "last": vars(series[-1])}
                for key, series in self.usage.items()
            },
            "workdir": str(self.workdir),
        }


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


def render(summary: dict[str, Any]) -> Iterator[str]:
    """The summary as lines for a terminal."""
    yield f"seed {summary['seed']}: {summary['rounds']} rounds on {','.join(summary['nodes'])}"
    yield "faults: " + ", ".join(f"{k} {n}" for k, n in sorted(summary["faults"].items()))
    total = sum(summary["violations"].values())
    yield f"violations: {total} (" + ", ".join(
        f"{k} {n}" for k, n in summary["violations"].items()) + ")"  # fmt: skip
    for kind, spread in summary["convergence_s"].items():
        yield (f"convergence {kind}: n={spread['n']} p50={spread['p50']}s "
               f"p99={spread['p99']}s max={spread['max']}s")  # fmt: skip
    live = summary["liveness_detection_s"]
    checked = "" if summary["liveness_checked"] else " (not checked)"
    yield f"liveness detection: n={live['n']} p50={live['p50']}s p99={live['p99']}s{checked}"
    jobs = summary["jobs"]
    yield f"jobs: {jobs['completed']}/{jobs['run']} completed"
    job_rounds = summary["supervised"]
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(job_rounds["rounds"].items())) or "none"
    yield (f"supervised rounds: {kinds}; false stops: {job_rounds['false_stops']}; "
           f"jobs failing on a peer before their stop: {job_rounds['cascaded']}")  # fmt: skip
    for kind, spread in job_rounds["stop_latency_s"].items():
        yield (f"stop latency {kind}: n={spread['n']} p50={spread['p50']}s "
               f"p99={spread['p99']}s max={spread['max']}s")  # fmt: skip
    for key, usage in summary["resources"].items():
        first, last = usage["first"], usage["last"]
        yield (f"resources {key}: fds {first['fds']} -> {last['fds']}, "
               f"RSS {first['rss_kib']} -> {last['rss_kib']} KiB "
               f"(rounds {first['round']}-{last['round']})")  # fmt: skip


def execute(options: Options, out: Callable[[str], None] = print) -> dict[str, Any]:
    """Run a whole campaign and return its summary; the workdir goes unless kept or failed."""
    keep = options.keep is not None
    workdir = Path(options.keep) if options.keep else Path(tempfile.mkdtemp(prefix="rp-campaign-"))
    workdir.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(options, workdir, out)
    out(f"seed {campaign.seed}")
    out(f"nodes {','.join(campaign.hosts)}; faults {','.join(options.faults)}; workdir {workdir}")
    if options.supervised_every:
        out(
            f"supervised-job rounds: every round divisible by {options.supervised_every}; "
            f"jobs {','.join(options.jobs)}"
        )
    try:
        campaign.run()
    finally:
        campaign.close()
    summary = campaign.summary()
    for line in render(summary):
        out(line)
    if options.out is not None:
        Path(options.out).write_text(json.dumps(summary, indent=2) + "\n")
    if campaign.violations:
        out(f"logs and history kept in {workdir}")
    elif not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def parse(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    parser.add_argument("--faults", default=",".join(Options.faults),
                        help=f"comma list out of {','.join(FAULTS)}")  # fmt: skip
    parser.add_argument("--cycle", action="store_true",
                        help="take the faults (and job kinds) in the given order instead of "
                             "at random")  # fmt: skip
    parser.add_argument("--supervised-every", type=int, default=Options.supervised_every,
                        help="every Nth round is a supervised-job round (0: none)")  # fmt: skip
    parser.add_argument("--jobs", default=",".join(JOB_KINDS),
                        help=f"job faults of those rounds: {','.join(JOB_KINDS)}")  # fmt: skip
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--relay-group", type=int, default=0, help="the sidecars' --relay-group")
    parser.add_argument("--keepalive", type=float, default=1.5,
                        help="the sidecars' --keepalive, s (0: flag not passed)")  # fmt: skip
    parser.add_argument("--job-every", type=int, default=3,
                        help="a torch job every N rounds (0: none)")  # fmt: skip
    parser.add_argument("--convergence", type=float, default=30.0, help="bound after a heal, s")
    parser.add_argument("--no-liveness-check", dest="liveness_check", action="store_false")
    parser.add_argument("--out", type=Path, default=None, help="write the summary here (JSON)")
    parser.add_argument("--keep", type=Path, default=None, help="workdir to keep (logs, history)")
    args = parser.parse_args(argv)
    faults = tuple(f for f in args.faults.split(",") if f)
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"unknown faults {unknown}; choose from {','.join(FAULTS)}")
    if "kill_relay" in faults and args.relay_group < 2:
        parser.error("kill_relay needs --relay-group 2 or more")
    if args.nodes < 3:
        parser.error("--nodes must be at least 3")
    jobs = tuple(j for j in args.jobs.split(",") if j)
    unknown = [j for j in jobs if j not in JOB_KINDS]
    if unknown or not jobs:
        parser.error(f"unknown jobs {unknown}; choose from {','.join(JOB_KINDS)}")
    if args.supervised_every < 0:
        parser.error("--supervised-every must be 0 or more")
    return Options(
        rounds=args.rounds, seed=args.seed, faults=faults, nodes=args.nodes,
        relay_group=args.relay_group, keepalive_s=args.keepalive, job_every=args.job_every,
        convergence_s=args.convergence, liveness_check=args.liveness_check, cycle=args.cycle,
        supervised_every=args.supervised_every, jobs=jobs, out=args.out, keep=args.keep,
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    reason = harness.prerequisites()
    if reason is not None:
        print(f"error: namespace clusters cannot run here: {reason}", file=sys.stderr)
        return 2
    harness.sweep_stale()
    try:
        summary = execute(options)
    finally:
        harness.close_all()
    return 1 if sum(summary["violations"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
