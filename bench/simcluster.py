"""One real master sidecar against N simulated workers, in two network namespaces.

The master (`rallypoint serve`, explicit provider, NNODES = N + 1) runs in namespace
``main1`` pinned to CPU 0; bench/simpeers.py runs in namespace ``sim1`` pinned to CPU 1, as
one or more processes that split the ranks and start at the same instant. The master's
hosts file maps every simulated name w1..wN to sim1's address, so its getaddrinfo-based
verification and its start-up pokes (refused at once: nothing listens on sim1's peer port)
work without any DNS server. Used by scale.py, herd.py and tcpstore_compare.py.

The master serves torch's variables only (``--frameworks torch``). Simulated workers hold no
ports (their TF port is only a number in the document, and they publish no probe port), so
with TF_CONFIG wanted the master's connectivity check would probe sim1's TF ports, be
refused and (rightly) never pass; with torch alone its plan has nothing to probe on them,
while its name verification, its own report and the cluster-wide verdict run as in a real
cluster. The simulated workers report their own checks as passed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import common
from rallypoint.core import fanout
from tests.support.cluster import runs
from tests.support.cluster.build import Cluster
from tests.support.cluster.layout import PEER_PORT
from tests.support.cluster.nodes import Node
from tests.support.netns import wait_for

TOKEN = "bench-session-secret"
MASTER_ARGS = (
    "--no-mdns",  # isolate the HTTP rendezvous; mDNS is a separate fast path
    "--deadline", "300",
    "--long-poll", "60",
    "--backoff-max", "0.5",
    "--frameworks", "torch",  # nothing listens on the simulated TF ports: see above
)  # fmt: skip


@dataclass
class SimResult:
    """What one simulation measured."""

    nnodes: int
    sim: dict[str, Any]
    master_cpu_s: float  # CPU the master spent from the simulated start to the last document
    master_cpu_total_s: float  # including its own start-up
    master_rss_mb: float
    master_hwm_mb: float
    master_rss_before_mb: float  # its RSS just before the simulated workers started
    master_ready_s: float | None  # from the simulated start until the master's /readyz is 200
    #: The fan-out tree's group size (0: every simulated worker joins the master directly).
    relay_group: int = 0
    #: The rank a real relay sidecar played (its group's simulated workers join it), if any.
    real_relay: int | None = None
    #: From the simulated start until the real relay's /readyz is 200.
    real_relay_ready_s: float | None = None
    real_relay_cpu_s: float = 0.0
    #: The rank a real worker sidecar played (simulate's ``real_worker``), if any.
    real_worker: int | None = None
    real_worker_ready: bool = False
    #: What ``after`` returned (simulate's argument), measured before teardown.
    after: Any = field(default=None)

    @property
    def complete(self) -> bool:
        """Every node verified one identical, complete document (a real relay: its /readyz)."""
        s = self.sim
        simulated = s["count"] - (self.real_relay is not None) - (self.real_worker is not None)
        return (
            s["verified_ok"] == simulated
            and s["docs_identical"]
            and (self.real_relay is None or self.real_relay_ready_s is not None)
            and (self.real_worker is None or self.real_worker_ready)
        )

    @property
    def converge_s(self) -> float:
        """Until the last node held a verified verdict; NaN unless complete."""
        if not self.complete:
            return float("nan")
        relay = [self.real_relay_ready_s] if self.real_relay_ready_s is not None else []
        return float(max([*self.sim["verified_s"], *relay]))

    @property
    def last_doc_s(self) -> float:
        """Until the last simulated node held the document; NaN unless all did."""
        s = self.sim
        simulated = s["count"] - (self.real_relay is not None) - (self.real_worker is not None)
        return float(max(s["doc_s"])) if s["doc_ok"] == simulated else float("nan")

    #: TcpExt counters in the master's namespace: accept-queue overflows and dropped SYNs.
    listen_overflows: int = 0
    listen_drops: int = 0


def prerequisites() -> str | None:
    return runs.prerequisites()


def simulate(
    workers: int,
    *,
    poll: bool = True,
    report: bool = True,
    procs: int = 1,
    sim_cpus: frozenset[int] = frozenset({1}),
    timeout_s: float = 120.0,
    profile: Path | None = None,
    tree: bool = False,
    master_args: Sequence[str] = (),
    after: Callable[[dict[str, Node]], Any] | None = None,
    real_worker: bool = False,
) -> SimResult:
    """Run one master and ``workers`` simulated workers; the cluster is torn down afterwards.

    The simulated workers run as ``procs`` processes on ``sim_cpus``. With ``profile``,
    py-spy samples the master during the simulation and writes collapsed stacks
    (flamegraph.pl / speedscope input) to that file. ``master_args`` are added to the
    master's (and the real relay's) `rallypoint serve`; ``after(nodes)`` runs once the
    simulated workers finished, before teardown, with the real sidecars by role ("master",
    and "relay", "worker" when played), and its value is the result's ``after``. With
    ``real_worker`` a real sidecar plays the last worker (the last member of the real relay's
    group in a tree), so a worker's own side is measured too.
    """
    nnodes = workers + 1
    # The tree as every node computes it (core/fanout.py); the second-to-last relay is played by
    # a real sidecar, so a real relay's hop is on the measured path (its group is full).
    group = fanout.group_size(nnodes, None) if tree else 0
    relays = list(fanout.relays(group, nnodes))
    real_relay = relays[-2] if len(relays) >= 2 else None
    names = [f"w{i}" for i in range(1, workers + 1)]
    if real_relay is not None:
        names[real_relay - 1] = "relay1"
    worker_rank = None
    if real_worker:
        members = fanout.group(real_relay, group, nnodes) if real_relay is not None else None
        worker_rank = members[-1] if members else workers
        names[worker_rank - 1] = "worker1"
    ranks = {"main1": 0, "relay1": real_relay, "worker1": worker_rank}

    def environ_for(cluster: Cluster, node: Node) -> dict[str, str]:
        return {
            "RALLYPOINT_HOSTS": ",".join(["main1", *names]),
            "RALLYPOINT_NODE_RANK": str(ranks.get(node.name)),
            "RALLYPOINT_SESSION": cluster.session,
            "RALLYPOINT_TOKEN": TOKEN,
        }

    hosts = (
        "main1",
        "sim1",
        *(("relay1",) if real_relay is not None else ()),
        *(("worker1",) if worker_rank is not None else ()),
    )
    with (
        common.workdir("rp-sim-") as workdir,
        Cluster(
            hosts,
            workdir,
            sidecar_args=MASTER_ARGS,
            environ_for=environ_for,
            session=f"bench-{os.getpid()}",
        ) as cluster,
    ):
        master, sim = cluster["main1"], cluster["sim1"]
        extra = "".join(f"{sim.address}\t{name}\n" for name in names)
        master.write_hosts(cluster.hosts_text({}) + extra)
        # All N connect within milliseconds: a listen queue of somaxconn (4096) overflows at
        # 16384, and every connection whose handshake was dropped is reset later. Both
        # settings are per namespace; an operator of a cluster this size raises them too.
        master.run(["sysctl", "-qw", "net.core.somaxconn=65535"], check=True)
        master.run(["sysctl", "-qw", "net.ipv4.tcp_max_syn_backlog=65535"], check=True)
        tree_args = (*(() if tree else ("--relay-group", "0")), *master_args)
        proc = master.start_sidecar(tree_args)
        os.sched_setaffinity(proc.pid, {0})
        wait_for(
            lambda: master.try_get("/livez"), timeout_s=30, interval_s=0.02, what="master /livez"
        )
        relay_node = relay_proc = None
        if real_relay is not None:
            relay_node = cluster["relay1"]
            relay_node.write_hosts(cluster.hosts_text({}) + extra)
            relay_proc = relay_node.start_sidecar(tree_args)
            os.sched_setaffinity(relay_proc.pid, set(sim_cpus))
            wait_for(
                lambda: relay_node.try_get("/livez"),
                timeout_s=30,
                interval_s=0.02,
                what="relay /livez",
            )
            settle(relay_proc.pid, quiet_s=0.5, timeout_s=180.0)
        worker_node = None
        if worker_rank is not None:
            worker_node = cluster["worker1"]
            worker_node.write_hosts(cluster.hosts_text({}) + extra)
            worker_proc = worker_node.start_sidecar(tree_args)
            os.sched_setaffinity(worker_proc.pid, set(sim_cpus))
        # Let the start-up pokes (one per simulated name, each resolving it through a hosts
        # file of N lines) finish: at 16384 they take far longer than a second, and their
        # CPU would be counted as the run's.
        settle(proc.pid, quiet_s=0.5, timeout_s=180.0)
        cpu0 = common.cpu_seconds(proc.pid)
        relay_cpu0 = 0.0 if relay_proc is None else common.cpu_seconds(relay_proc.pid)
        rss0 = common.memory_kib(proc.pid)["VmRSS"] / 1024
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [
                    py_spy(),
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--format",
                    "raw",
                    "--rate",
                    "200",
                    "--nonblocking",
                    "--output",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
        start_at = time.monotonic() + 1.0 + 0.0003 * workers  # every process parked by then
        runners = []
        for first, count in split(workers, procs, group):
            argv = [
                sys.executable,
                str(common.BENCH_DIR / "simpeers.py"),
                "--master",
                f"{master.address}:{PEER_PORT}",
                "--session",
                cluster.session,
                "--first",
                str(first),
                "--count",
                str(count),
                "--start-at",
                repr(start_at),
                "--address",
                sim.address,
                "--token",
                TOKEN,
                "--timeout",
                str(timeout_s),
            ]
            if group:
                argv += ["--nnodes", str(nnodes), "--relay-group", str(group)]
            if worker_rank is not None:
                argv += ["--real-worker", str(worker_rank)]
            if relay_node is not None:
                argv += [
                    "--real-relay",
                    str(real_relay),
                    "--relay-address",
                    f"{relay_node.address}:{PEER_PORT}",
                ]
            if not poll:
                argv.append("--no-poll")
            if not report:
                argv.append("--no-report")
            runner = sim.spawn(argv, label="simpeers")
            os.sched_setaffinity(runner.pid, set(sim_cpus))
            runners.append(runner)
        ready_at = relay_ready_at = None
        deadline = time.monotonic() + timeout_s + 30
        while any(r.alive() for r in runners) and time.monotonic() < deadline:
            if ready_at is None and poll:
                reply = master.try_get("/readyz", timeout_s=2)
                if reply is not None and reply.status == 200:
                    ready_at = time.monotonic()
            if relay_node is not None and relay_ready_at is None and poll:
                reply = relay_node.try_get("/readyz", timeout_s=2)
                if reply is not None and reply.status == 200:
                    relay_ready_at = time.monotonic()
            time.sleep(0.01)
        relay_cpu = 0.0 if relay_proc is None else common.cpu_seconds(relay_proc.pid) - relay_cpu0
        for runner in runners:
            runner.wait(5)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        cpu1 = common.cpu_seconds(proc.pid)
        mem = common.memory_kib(proc.pid)
        worker_ready = worker_node is not None and wait_ready(worker_node, timeout_s=60.0)
        real = {"master": master, "relay": relay_node, "worker": worker_node}
        measured = None if after is None else after({k: v for k, v in real.items() if v})
        tcpext = tcp_ext(master)
        result = merge(
            [
                json.loads(next(t for t in reversed(r.log().splitlines()) if t.startswith("{")))
                for r in runners
            ]
        )
        return SimResult(
            nnodes=workers + 1,
            sim=result,
            master_cpu_s=cpu1 - cpu0,
            master_cpu_total_s=cpu1,
            master_rss_mb=mem["VmRSS"] / 1024,
            master_hwm_mb=mem["VmHWM"] / 1024,
            master_rss_before_mb=rss0,
            master_ready_s=None if ready_at is None else ready_at - result["start"],
            listen_overflows=tcpext.get("ListenOverflows", 0),
            listen_drops=tcpext.get("ListenDrops", 0),
            relay_group=group,
            real_relay=real_relay,
            real_relay_ready_s=None if relay_ready_at is None else relay_ready_at - result["start"],
            real_relay_cpu_s=relay_cpu,
            real_worker=worker_rank,
            real_worker_ready=worker_ready,
            after=measured,
        )


def wait_ready(node: Node, timeout_s: float) -> bool:
    """Whether ``node``'s /readyz turns 200 within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        reply = node.try_get("/readyz", timeout_s=2)
        if reply is not None and reply.status == 200:
            return True
        time.sleep(0.1)
    return False


def tcp_ext(node: Node) -> dict[str, int]:
    """The TcpExt counters of /proc/net/netstat as seen inside node's namespace."""
    lines = node.run(["cat", "/proc/net/netstat"]).stdout.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=False))
    return {}


def split(workers: int, procs: int, group: int = 0) -> list[tuple[int, int]]:
    """(first rank, count) for each simulator process: ranks 1..workers in near-equal runs,
    cut only at group boundaries in a tree (a simulated relay plays its whole group)."""
    procs = max(1, min(procs, workers))
    out, first = [], 1
    for i in range(procs):
        end = 1 + workers * (i + 1) // procs
        if group and i < procs - 1:
            end = max(first, end - end % group)
        if end > first:
            out.append((first, end - first))
        first = end
    return out


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One simulator result from the per-process ones; times relative to the common start.

    ``docs_identical`` holds only when every worker that got a document got the same bytes
    (one digest in all processes) and that document lists every node.
    """
    start = min(p["start"] for p in parts)
    digests = sorted({d for p in parts for d in p["doc_digests"]})
    members = {p["doc_members"] for p in parts if p["doc_members"] is not None}
    errors: dict[str, int] = {}
    for p in parts:
        for key, n in p["errors"].items():
            errors[key] = errors.get(key, 0) + n
    count = sum(p["count"] for p in parts)
    return {
        "start": start,
        "start_skew_s": max(p["start"] for p in parts) - start,
        "count": count,
        "procs": len(parts),
        "join_ok": sum(p["join_ok"] for p in parts),
        "join_s": [x for p in parts for x in p["join_s"]],
        "doc_ok": sum(p["doc_ok"] for p in parts),
        "doc_s": [t - start for p in parts for t in p["doc_at"]],
        "verified_ok": sum(p["verified_ok"] for p in parts),
        "verified_s": [t - start for p in parts for t in p["verified_at"]],
        "doc_digests": digests,
        "docs_identical": len(digests) == 1 and members == {count + 1},
        "doc_bytes": max(p["doc_bytes"] for p in parts),
        "doc_wire_bytes": max(p["doc_wire_bytes"] for p in parts),
        "doc_members": next(iter(members)) if len(members) == 1 else None,
        "errors": errors,
        "sim_cpu_s": round(sum(p["sim_cpu_s"] for p in parts), 2),
        "sim_cpu_s_per_proc": [p["sim_cpu_s"] for p in parts],
    }


def py_spy() -> str:
    """py-spy from this interpreter's environment (the bench extra), else from PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else "py-spy"


def settle(pid: int, *, quiet_s: float, timeout_s: float) -> None:
    """Wait until pid has used (almost) no CPU for quiet_s seconds, at most timeout_s."""
    time.sleep(1.0)
    end = time.monotonic() + timeout_s
    last = common.cpu_seconds(pid)
    while time.monotonic() < end:
        time.sleep(quiet_s)
        now = common.cpu_seconds(pid)
        if now - last < 0.05 * quiet_s:
            return
        last = now
