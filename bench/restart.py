"""How fast `rallypoint run --restarts` brings a real job back on every node, beside torchrun's.

A namespace cluster (tests/support/cluster/, default sidecar settings: a keep-alive every
3 s) runs a gloo job that resumes from a per-step checkpoint (tests/support/steps.py: it
computes for --compute seconds, all-reduces --mib MiB, writes its step) on every node:

* crash: `rallypoint run --restarts 1 --grace G`; rank 1 exits 3 after step 2 of attempt
  0. From its FAIL line to each node's LAUNCH line of attempt 1 (the child process started,
  before torch's import), and whether every node's run then ended 0.
* lost-back: `rallypoint run --restarts 1`; sub1 vanishes (link down, every process of
  its namespace SIGKILLed), and --back seconds later (20: past the 15 s liveness bound, so
  the others have named it lost, stopped and wait for the next attempt) its link comes up
  and its sidecar and its `run` start again (a container restarted). From that restart to
  each node's LAUNCH line of attempt 1, and whether every node's run then ended 0.
* torchrun: the crash case under `torchrun --rdzv-backend c10d --max-restarts 1` (started
  by `rallypoint exec` for its endpoint, MASTER_ADDR:MASTER_PORT), torch's own restart in
  place. From the FAIL line to each node's LAUNCH line of torchrun's restart 1, and
  whether every node's torchrun ended 0 (what it does is reported, finished or not).

    python -m bench.restart                   # N = 4 and 8, 3 runs each
    python -m bench.restart --sizes 4 --runs 5
    python -m bench.restart --quick           # N = 4, 1 run each
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from bench import common
from bench.stop import fresh, lines, vanish
from bench.time_to_ready import each_cluster
from tests.support import steps
from tests.support.cluster.build import Cluster
from tests.support.cluster.procs import Proc
from tests.support.netns import wait_for

#: The targets: every node's child of the next attempt started within --grace + 2 s of a
#: crash; within 3 s of a lost node's return.
CRASH_MARGIN_S = 2.0
BACK_TARGET_S = 3.0
#: How long one job may take at most, on a loaded machine (it ends by itself well before).
JOB_S = 300.0


def job_args(args: Any, checkpoint: str) -> list[str]:
    return ["--mib", str(args.mib), "--compute-s", str(args.compute), "--steps",
            str(args.steps), "--checkpoint", checkpoint]  # fmt: skip


def launched(proc: Proc, attempt: int) -> float | None:
    found = [x["at"] for x in lines(proc, "LAUNCH") if x["attempt"] == attempt]
    return found[0] if found else None


def ended(procs: dict[str, Proc], timeout_s: float = JOB_S) -> dict[str, int | None]:
    """Every process's status, None for one still running ``timeout_s`` after the call."""
    deadline = time.monotonic() + timeout_s
    codes: dict[str, int | None] = {}
    for name, proc in procs.items():
        try:
            codes[name] = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            codes[name] = None
    return codes


def one_run(cluster: Cluster, scenario: str, args: Any, run_no: int) -> dict[str, Any]:
    fresh(cluster)
    checkpoint = str(cluster.workdir / f"ckpt-{scenario}-{run_no}-rank{{rank}}")
    script = [sys.executable, str(steps.__file__), *job_args(args, checkpoint)]
    nodes = list(cluster)
    victim = nodes[1]
    run = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "120",
           "--restarts", "1", "--grace", str(args.grace)]  # fmt: skip
    if scenario == "torchrun":
        torchrun = (
            f'exec {sys.executable} -m torch.distributed.run --nnodes "$NNODES"'
            " --nproc-per-node 1 --rdzv-backend c10d"
            ' --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id bench --max-restarts 1 "$@"'
        )
        argv = [sys.executable, "-m", "rallypoint", "exec", "--quiet", "--timeout", "120", "--",
                "sh", "-c", torchrun, "torchrun", *script[1:]]  # fmt: skip
    else:
        argv = [*run, "--", *script]
    if scenario in ("crash", "torchrun"):
        argv += ["--fail-rank", "1", "--fail-step", "2", "--fail-attempt", "0"]
    procs = {node.name: node.spawn(argv, label="job") for node in nodes}
    try:
        wait_for(
            lambda: all(lines(p, "STEP") for p in procs.values()),
            timeout_s=240.0, what="every rank past its first step", describe=cluster.logs,
        )  # fmt: skip
        if scenario == "lost-back":
            vanish(victim)
            time.sleep(args.back)
            victim.link_up()
            t0 = time.time()
            victim.start_sidecar()
            procs[victim.name] = victim.spawn(argv, label="job-again")
        else:
            source = procs[victim.name]
            wait_for(lambda: lines(source, "FAIL"), timeout_s=120.0, what="the crash",
                     describe=cluster.logs)  # fmt: skip
            t0 = lines(source, "FAIL")[0]["at"]
        codes = ended(procs, args.job_timeout)
    finally:
        for proc in procs.values():
            proc.kill()
    delays = [launched(p, 1) for p in procs.values()]
    return {
        "codes": codes,
        "completed": all(code == 0 for code in codes.values()),
        "delays_s": [None if d is None else round(d - t0, 3) for d in delays],
    }


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8])
    p.add_argument("--runs", type=int, default=3, help="runs per size and scenario")
    p.add_argument("--mib", type=float, default=4.0)
    p.add_argument("--compute", type=float, default=0.5, help="seconds of compute per step")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--grace", type=float, default=5.0)
    p.add_argument("--back", type=float, default=20.0, help="seconds until the lost node returns")
    p.add_argument("--job-timeout", type=float, default=JOB_S,
                   help="seconds a run may take (a hung torchrun: not completed)")  # fmt: skip
    args = p.parse_args()
    if args.quick:
        args.sizes, args.runs = [4], 1
    table: list[dict[str, Any]] = []
    for n, cluster in each_cluster(args.sizes, "restart", "rp-restart-"):
        for scenario in ("crash", "lost-back", "torchrun"):
            delays: list[float] = []
            completed = 0
            missing = 0
            for i in range(args.runs):
                run = one_run(cluster, scenario, args, i)
                completed += run["completed"]
                missing += sum(d is None for d in run["delays_s"])
                delays += [d for d in run["delays_s"] if d is not None]
                print(f"N={n} {scenario:9s} run {i}: next attempt launched after "
                      f"{run['delays_s']} s, exit {run['codes']}", flush=True)  # fmt: skip
            table.append({"nnodes": n, "scenario": scenario, "runs": args.runs,
                          "completed": completed, "not_restarted": missing,
                          "delay_s": common.summary(delays)})  # fmt: skip
    targets = {}
    for row in table:
        worst = row["delay_s"].get("max", float("nan"))
        if row["scenario"] == "crash":
            want = args.grace + CRASH_MARGIN_S
        elif row["scenario"] == "lost-back":
            want = BACK_TARGET_S
        else:
            continue
        ok = worst <= want and row["completed"] == row["runs"]
        key = f"{row['scenario']}_n{row['nnodes']}_max_s"
        targets[key] = common.target(worst, f"<= {want:g} and every run completed", ok)
    common.print_targets(targets)
    for row in table:
        print(f"N={row['nnodes']:2d} {row['scenario']:9s} p50 {row['delay_s'].get('p50')} s, "
              f"max {row['delay_s'].get('max')} s, completed {row['completed']}/{row['runs']}, "
              f"not restarted {row['not_restarted']}")  # fmt: skip
    common.write_run_summary(
        "restart",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs}",
        {"table": table, "targets": targets, "grace_s": args.grace, "back_s": args.back},
    )


if __name__ == "__main__":
    main()
