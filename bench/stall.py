"""How fast a hang is named and stopped everywhere, and how often the right rank is named.

A namespace cluster (tests/support/cluster/, default sidecar settings) runs
``rallypoint run --stall-timeout S -- steps.py --progress`` on every node: a gloo loop that
marks RALLYPOINT_PROGRESS_FILE once its batch is loaded and once before each step's
all-reduce of --mib MiB, after --compute seconds of compute, with gloo's default collective
timeout of 30 minutes. In each run one rank (a different one each run, the master's
included) hangs in the data phase of step 3 (``--stall RANK:3``); the others block in that
step's all-reduce. Per run it records, from the hung rank's STALL line (the moment it stopped
progressing):

* each node's job signalled (the job's own SIGTERM line, the shared wall clock);
* the rank every node's first-failure line names, against the rank that hung.

The target: every node's job stopped within S + 2 s of the hang.

    python -m bench.stall                      # N = 4 and 8, S = 10 and 30, 3 runs each
    python -m bench.stall --sizes 4 --stalls 10 --runs 5
    python -m bench.stall --quick              # N = 4, S = 10, 1 run
"""

from __future__ import annotations

import re
import time
from typing import Any

from bench import common
from bench.stop import fresh, lines, start_jobs, wait_steps
from bench.time_to_ready import each_cluster
from tests.support.cluster.build import Cluster

#: Gloo's default collective timeout (torch.distributed): what a blocked job waits out.
GLOO_TIMEOUT_S = 1800.0
#: The target beyond the stall timeout.
MARGIN_S = 2.0
#: The step the hung rank never finishes loading.
STALL_STEP = 3
_NAMED = re.compile(r"^rallypoint: first failure: \S+ \(rank (\d+)\) stalled ")


def one_run(cluster: Cluster, n: int, stall_s: float, run: int, args: Any) -> dict[str, Any]:
    fresh(cluster)
    hung = run % n
    launcher = ["run", "--quiet", "--timeout", "120", "--stall-timeout", f"{stall_s:g}"]
    job = ["--mib", str(args.mib), "--compute-s", str(args.compute), "--progress"]
    procs = start_jobs(cluster, launcher, [*job, "--stall", f"{hung}:{STALL_STEP}"])
    try:
        wait_steps(cluster, procs, STALL_STEP - 1)
        deadline = time.monotonic() + stall_s + 120.0
        codes = {}
        for name, proc in procs.items():
            codes[name] = proc.wait(max(1.0, deadline - time.monotonic()))
        stalls = [s for p in procs.values() for s in lines(p, "STALL")]
        t0 = stalls[0]["at"]
        delays, named = [], []
        for proc in procs.values():
            stops = lines(proc, "SIGTERM")
            delays.append(round(stops[0]["at"] - t0, 3) if stops else float("nan"))
            found = [_NAMED.match(x) for x in proc.log().splitlines()]
            ranks = [int(m.group(1)) for m in found if m]
            named.append(ranks[-1] if ranks else -1)
    finally:
        for proc in procs.values():
            proc.kill()
    return {"hung": hung, "codes": codes, "delays_s": delays, "named": named}


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8])
    p.add_argument("--stalls", type=float, nargs="+", default=[10.0, 30.0])
    p.add_argument("--runs", type=int, default=3, help="runs per size and stall timeout")
    p.add_argument("--mib", type=float, default=4.0)
    p.add_argument("--compute", type=float, default=0.5, help="seconds of compute per step")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.stalls, args.runs = [4], [10.0], 1
    table: list[dict[str, Any]] = []
    for n, cluster in each_cluster(args.sizes, "stall", "rp-stall-"):
        for stall_s in args.stalls:
            delays: list[float] = []
            right = named = 0
            codes: set[int] = set()
            for i in range(args.runs):
                run = one_run(cluster, n, stall_s, i, args)
                delays += run["delays_s"]
                named += len(run["named"])
                right += sum(rank == run["hung"] for rank in run["named"])
                codes |= set(run["codes"].values())
                print(f"N={n} S={stall_s:g} run {i}: rank {run['hung']} hung; stopped after"
                      f" {run['delays_s']} s; named {run['named']}; exit {run['codes']}",
                      flush=True)  # fmt: skip
            table.append({"nnodes": n, "stall_timeout_s": stall_s, "runs": args.runs,
                          "stopped_after_s": common.summary(delays), "codes": sorted(codes),
                          "named_right": f"{right} of {named}"})  # fmt: skip
    targets = {}
    for row in table:
        want = row["stall_timeout_s"] + MARGIN_S
        worst = row["stopped_after_s"].get("max", float("nan"))
        key = f"n{row['nnodes']}_s{row['stall_timeout_s']:g}_max_s"
        targets[key] = common.target(worst, f"<= {want:g}", worst <= want)
    common.print_targets(targets)
    for row in table:
        print(f"N={row['nnodes']:2d} S={row['stall_timeout_s']:g}: p50"
              f" {row['stopped_after_s'].get('p50')} s, max {row['stopped_after_s'].get('max')} s,"
              f" named right {row['named_right']}, exit {row['codes']}")  # fmt: skip
    common.write_run_summary(
        "stall",
        args,
        f"--sizes {' '.join(map(str, args.sizes))}"
        f" --stalls {' '.join(f'{s:g}' for s in args.stalls)} --runs {args.runs}",
        {"gloo_timeout_s": GLOO_TIMEOUT_S, "table": table, "targets": targets},
    )


if __name__ == "__main__":
    main()
