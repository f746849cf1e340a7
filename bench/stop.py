"""How fast `rallypoint run` stops a real job everywhere, beside the collective timeout it replaces.

A namespace cluster (tests/support/cluster/, default sidecar settings: a keep-alive every
3 s) runs `rallypoint run -- steps.py` on every node: a gloo loop that computes for
--compute seconds, then all-reduces --mib MiB of float32, with gloo's default collective
timeout of 30 minutes. Each run injects one fault and times, on every other node, the moment
its job was signalled (the job's own SIGTERM line, stamped by the shared wall clock):

* fail: rank 1 exits 3 after its third step; from its FAIL line to each SIGTERM line.
* lost: one node vanishes (link down, then every process of its namespace SIGKILLed: no
  FIN, no RST); from the kill to each SIGTERM line. The survivors are blocked in all_reduce.
* lost-master: the same for the master: each worker names its own upstream, one interval
  later than a member is named (docs/readiness.md "After ready").
On a loaded machine a survivor's collective may fail on a peer that `run` stopped a moment
earlier, before its own SIGTERM arrives: such a job counts as stopped when its ERROR line
says so (``ended_by_peer_error`` counts them).

* baseline: the same vanishing node under `rallypoint exec` with gloo's timeout cut to
  --baseline-timeout seconds: how long the survivors stay blocked without supervision.

    python -m bench.stop                     # N = 4 and 8, 5 runs each
    python -m bench.stop --sizes 4 --runs 10 --baseline-runs 1
    python -m bench.stop --quick             # N = 4, 1 run, no baseline

In-process, --fanout N ...: N sidecars in one event loop (no jobs, connection checks off):
from one node's failure report to the first failure known on every node, which shows how the
push grows with N where namespaces and torch jobs do not fit this machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from bench import common
from bench.time_to_ready import each_cluster
from tests.support import steps
from tests.support.cluster.build import Cluster
from tests.support.cluster.nodes import Node
from tests.support.cluster.procs import Proc
from tests.support.netns import wait_for

#: Gloo's default collective timeout (torch.distributed): what a blocked job waits out.
GLOO_TIMEOUT_S = 1800.0
#: The targets: a failed job stops the others within 2 s at N = 4; a lost node within
#: the liveness bound (4 intervals of 3 s, one more to hear of it: 15 s) plus 1 s.
FAIL_TARGET_S = 2.0
LOST_TARGET_S = 16.0


def lines(proc: Proc, kind: str) -> list[dict[str, Any]]:
    prefix = kind + " "
    return [json.loads(x[len(prefix) :]) for x in proc.log().splitlines() if x.startswith(prefix)]


def start_jobs(cluster: Cluster, launcher: list[str], job: list[str]) -> dict[str, Any]:
    script = str(steps.__file__)
    argv = [sys.executable, "-m", "rallypoint", *launcher, "--", sys.executable, script]
    return {node.name: node.spawn([*argv, *job], label="job") for node in cluster}


def wait_steps(cluster: Cluster, procs: dict[str, Any], step: int) -> None:
    wait_for(
        lambda: all(any(s["step"] >= step for s in lines(p, "STEP")) for p in procs.values()),
        timeout_s=240.0,
        what=f"every rank past step {step}",
        describe=cluster.logs,
    )


def vanish(node: Node) -> float:
    """The node's link goes down, then every process in its namespace dies; when."""
    node.link_down()
    at = time.time()
    pids = subprocess.run(["ip", "netns", "pids", node.ns], capture_output=True, text=True)
    for pid in pids.stdout.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    return at


def fresh(cluster: Cluster) -> None:
    """Every sidecar (re)started and ready; every old process gone."""
    for node in cluster:
        for proc in node.procs:
            proc.kill()
        node.procs.clear()
        node.link_up()
    for node in cluster:
        node.start_sidecar()
    cluster.wait_all_ready(120.0)


def one_run(cluster: Cluster, scenario: str, args: Any) -> dict[str, Any]:
    fresh(cluster)
    nodes = list(cluster)
    victim = nodes[0] if scenario == "lost-master" else nodes[1]
    job = ["--mib", str(args.mib), "--compute-s", str(args.compute)]
    if scenario == "fail":
        job += ["--fail-rank", "1", "--fail-step", "2", "--fail-code", "3"]
        launcher = ["run", "--quiet", "--timeout", "120"]
    elif scenario in ("lost", "lost-master"):
        launcher = ["run", "--quiet", "--timeout", "120"]
    else:
        launcher = ["exec", "--quiet", "--timeout", "120"]
        job += ["--timeout", str(args.baseline_timeout)]
    procs = start_jobs(cluster, launcher, job)
    survivors = [n.name for n in nodes if n is not victim]
    try:
        wait_steps(cluster, procs, 1)
        if scenario == "fail":
            wait_for(lambda: lines(procs[victim.name], "FAIL"), timeout_s=120.0,
                             what="the failure", describe=cluster.logs)  # fmt: skip
            t0 = lines(procs[victim.name], "FAIL")[0]["at"]
        else:
            t0 = vanish(victim)
        codes, delays, errors = {}, [], 0
        for name in survivors:
            codes[name] = procs[name].wait(args.baseline_timeout + 120.0)
            # When the job stopped: `run`'s SIGTERM reached it, or its collective failed on a
            # peer that had just been stopped (whichever came first), or without supervision
            # gloo's timeout ended it.
            ends = lines(procs[name], "SIGTERM") + lines(procs[name], "ERROR")
            errors += not lines(procs[name], "SIGTERM")
            delays.append(min(e["at"] for e in ends) - t0 if ends else time.time() - t0)
    finally:
        for proc in procs.values():
            proc.kill()
    return {"codes": codes, "delays_s": [round(d, 3) for d in delays], "peer_errors": errors}


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8])
    p.add_argument("--runs", type=int, default=5, help="runs per size and scenario")
    p.add_argument("--baseline-runs", type=int, default=1)
    p.add_argument("--baseline-timeout", type=float, default=60.0)
    p.add_argument("--mib", type=float, default=4.0)
    p.add_argument("--compute", type=float, default=3.0, help="seconds of compute per step")
    p.add_argument("--fanout", type=int, nargs="*", default=[], help="in-process sizes")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.runs, args.baseline_runs = [4], 1, 0
    table: list[dict[str, Any]] = []
    for n, cluster in each_cluster(args.sizes, "stop", "rp-stop-"):
        plan = [("fail", args.runs), ("lost", args.runs), ("lost-master", args.runs),
                ("baseline", args.baseline_runs)]  # fmt: skip
        for scenario, runs in plan:
            delays: list[float] = []
            codes: list[int] = []
            errors = 0
            for i in range(runs):
                run = one_run(cluster, scenario, args)
                delays += run["delays_s"]
                codes += list(run["codes"].values())
                errors += run["peer_errors"]
                print(f"N={n} {scenario:11s} run {i}: signalled after {run['delays_s']} s, "
                      f"exit {run['codes']}", flush=True)  # fmt: skip
            if runs:
                table.append({"nnodes": n, "scenario": scenario, "runs": runs,
                              "delay_s": common.summary(delays), "codes": sorted(set(codes)),
                              "ended_by_peer_error": errors})  # fmt: skip
    fanout = [asyncio.run(fanout_run(n)) for n in args.fanout]
    for row in fanout:
        print(f"in-process N={row['nnodes']}: first failure on every node after "
              f"{row['everywhere_s'] * 1000:.0f} ms", flush=True)  # fmt: skip
    targets = {}
    for row in table:
        if row["nnodes"] == 4 and row["scenario"] in ("fail", "lost", "lost-master"):
            want = FAIL_TARGET_S if row["scenario"] == "fail" else LOST_TARGET_S
            worst = row["delay_s"].get("max", float("nan"))
            targets[f"{row['scenario']}_n4_max_s"] = common.target(worst, f"<= {want:g}",
                                                                  worst <= want)  # fmt: skip
    common.print_targets(targets)
    for row in table:
        print(f"N={row['nnodes']:2d} {row['scenario']:11s} p50 {row['delay_s'].get('p50')} s, "
              f"max {row['delay_s'].get('max')} s, exit {row['codes']}")  # fmt: skip
    common.write_run_summary(
        "stop",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs} "
        f"--baseline-runs {args.baseline_runs}"
        + (f" --fanout {' '.join(map(str, args.fanout))}" if args.fanout else ""),
        {"gloo_timeout_s": GLOO_TIMEOUT_S, "table": table, "fanout": fanout, "targets": targets},
    )


async def fanout_run(n: int) -> dict[str, Any]:
    """N sidecars in one loop: from one node's failure report to the first failure on all."""
    from rallypoint.wire.jobstates import Report
    from tests.support.cluster.inprocess import ready_cluster

    settings = {r: {"keepalive_s": 30.0, "probe": False} for r in range(n)}
    async with ready_cluster(n, token="bench-secret", per_node=settings) as c:
        for sidecar in c.nodes.values():
            assert sidecar.node.jobs is not None
            await sidecar.node.jobs.report(Report("running", 1.0), settle_s=0.0)
        failing = c.nodes[n - 1].node.jobs
        assert failing is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        await failing.report(Report("exited", 1.0, 1), settle_s=0.0)
        while not all(s.node.jobs is not None and s.node.jobs.book.first for s in c.nodes.values()):
            if loop.time() - started > 60:
                raise SystemExit(f"in-process N={n}: the failure did not reach every node")
            await asyncio.sleep(0.001)
        return {"nnodes": n, "everywhere_s": round(loop.time() - started, 4)}


if __name__ == "__main__":
    main()
