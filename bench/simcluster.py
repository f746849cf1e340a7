"""One real master sidecar against N simulated workers, in two network namespaces.

The master (`rallypoint serve`, explicit provider, NNODES = N + 1) runs in namespace
``main1`` pinned to CPU 0; bench/simpeers.py runs in namespace ``sim1`` pinned to CPU 1.
The master's hosts file maps every simulated name w1..wN to sim1's address, so its
getaddrinfo-based verification and its start-up pokes (refused at once: nothing listens on
sim1's peer port) work without any DNS server. Used by scale.py and herd.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common

sys.path.insert(0, str(common.REPO))
from tests.multihost import harness

TOKEN = "bench-session-secret"
MASTER_ARGS = (
    "--no-mdns",  # isolate the HTTP rendezvous; mDNS is a separate fast path
    "--deadline", "300",
    "--long-poll", "60",
    "--backoff-max", "0.5",
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
    master_ready_s: float | None  # from the simulated start until the master's /readyz is 200
    #: TcpExt counters in the master's namespace: accept-queue overflows and dropped SYNs.
    listen_overflows: int = 0
    listen_drops: int = 0


def prerequisites() -> str | None:
    return harness.prerequisites()


def simulate(
    workers: int, *, poll: bool = True, timeout_s: float = 120.0, profile: Path | None = None
) -> SimResult:
    """Run one master and ``workers`` simulated workers; the cluster is torn down afterwards.

    With ``profile``, py-spy samples the master during the simulation and writes collapsed
    stacks (flamegraph.pl / speedscope input) to that file.
    """
    names = [f"w{i}" for i in range(1, workers + 1)]
    workdir = Path(tempfile.mkdtemp(prefix="rp-sim-"))

    def environ_for(cluster: harness.Cluster, node: harness.Node) -> dict[str, str]:
        return {
            "RALLYPOINT_HOSTS": ",".join(["main1", *names]),
            "RALLYPOINT_NODE_RANK": "0",
            "RALLYPOINT_SESSION": cluster.session,
            "RALLYPOINT_TOKEN": TOKEN,
        }

    cluster = harness.Cluster(
        ("main1", "sim1"),
        workdir,
        sidecar_args=MASTER_ARGS,
        environ_for=environ_for,
        session=f"bench-{os.getpid()}",
    )
    with cluster:
        master, sim = cluster["main1"], cluster["sim1"]
        extra = "".join(f"{sim.address}\t{name}\n" for name in names)
        master.write_hosts(cluster.hosts_text({}) + extra)
        proc = master.start_sidecar()
        os.sched_setaffinity(proc.pid, {0})
        harness.wait_for(
            lambda: master.try_get("/livez"), timeout_s=30, interval_s=0.02, what="master /livez"
        )
        time.sleep(1.0)  # let the start-up pokes (one per simulated name) finish
        cpu0 = common.cpu_seconds(proc.pid)
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [
                    "py-spy",
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
        argv = [
            sys.executable,
            str(common.BENCH_DIR / "simpeers.py"),
            "--master",
            f"{master.address}:{harness.PEER_PORT}",
            "--session",
            cluster.session,
            "--count",
            str(workers),
            "--address",
            sim.address,
            "--token",
            TOKEN,
            "--timeout",
            str(timeout_s),
        ]
        if not poll:
            argv.append("--no-poll")
        runner = sim.spawn(argv, label="simpeers")
        os.sched_setaffinity(runner.pid, {1})
        ready_at = None
        deadline = time.monotonic() + timeout_s + 30
        while runner.alive() and time.monotonic() < deadline:
            if ready_at is None and poll:
                reply = master.try_get("/readyz", timeout_s=2)
                if reply is not None and reply.status == 200:
                    ready_at = time.monotonic()
            time.sleep(0.01)
        runner.wait(5)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        cpu1 = common.cpu_seconds(proc.pid)
        mem = common.memory_kib(proc.pid)
        tcpext = tcp_ext(master)
        line = next(t for t in reversed(runner.log().splitlines()) if t.startswith("{"))
        result: dict[str, Any] = json.loads(line)
        return SimResult(
            nnodes=workers + 1,
            sim=result,
            master_cpu_s=cpu1 - cpu0,
            master_cpu_total_s=cpu1,
            master_rss_mb=mem["VmRSS"] / 1024,
            master_hwm_mb=mem["VmHWM"] / 1024,
            master_ready_s=None if ready_at is None else ready_at - result["start"],
            listen_overflows=tcpext.get("ListenOverflows", 0),
            listen_drops=tcpext.get("ListenDrops", 0),
        )


def tcp_ext(node: harness.Node) -> dict[str, int]:
    """The TcpExt counters of /proc/net/netstat as seen inside node's namespace."""
    lines = node.run(["cat", "/proc/net/netstat"]).stdout.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=False))
    return {}
