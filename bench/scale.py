"""Scale: one real master sidecar against N simulated workers (bench/simcluster.py).

Convergence is the time from the moment all N simulated workers start (each joins,
long-polls /v1/cluster, then reports its checks and long-polls the master's verdict, on one
keep-alive connection) until the last one holds a verified verdict: every node would be
ready. The time until the last one held the document is reported beside it. A run counts
only when every worker got the same document bytes and that document lists every node.
Master CPU is utime + stime from /proc/<pid>/stat over that interval; peak RSS is its
VmHWM. Needs root (network namespaces).

    python bench/scale.py                    # N = 64, 512, 1024, 4096, 3 runs each
    python bench/scale.py --sizes 16384 --runs 1   # stretch
    python bench/scale.py --quick            # N = 64, 512, one run each
    python bench/scale.py --procs 2          # the simulator as 2 processes (both on CPU 1)
"""

from __future__ import annotations

import os
import statistics

import common
import simcluster

SIZES = (64, 512, 1024, 4096)


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--procs", type=int, default=2, help="simulator processes")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a simulated run may take")
    p.add_argument(
        "--sim-cpus", default="1", help="CPUs for the simulator, comma list (master: CPU 0)"
    )
    args = p.parse_args()
    sim_cpus = frozenset(int(c) for c in args.sim_cpus.split(","))
    if args.quick:
        args.sizes, args.runs = [64, 512], 1
    reason = simcluster.prerequisites()
    if reason is not None:
        raise SystemExit(f"scale benchmark needs network namespaces: {reason}")

    table = []
    for n in args.sizes:
        runs = []
        for i in range(args.runs):
            r = simcluster.simulate(n, procs=args.procs, sim_cpus=sim_cpus, timeout_s=args.timeout)
            s = r.sim
            complete = s["verified_ok"] == n and s["docs_identical"]
            converge = max(s["verified_s"]) if complete else float("nan")
            doc_s = max(s["doc_s"]) if s["doc_ok"] == n else float("nan")
            runs.append((converge, r))
            print(
                f"N={n:5d} run {i}: joined {s['join_ok']}/{n}, documents {s['doc_ok']}/{n} "
                f"(identical and complete: {s['docs_identical']}), "
                f"verified {s['verified_ok']}/{n}, "
                f"last document {doc_s:.3f} s, converged {converge:.3f} s, "
                f"master CPU {r.master_cpu_s:.2f} s "
                f"(total {r.master_cpu_total_s:.2f} s), VmHWM {r.master_hwm_mb:.1f} MB, "
                f"doc {s['doc_bytes'] / 1024:.0f} KiB ({s['doc_wire_bytes'] / 1024:.0f} KiB "
                f"on the wire), simulator CPU {s['sim_cpu_s']:.2f} s in {s['procs']} processes "
                f"{s['sim_cpu_s_per_proc']}, start skew {s['start_skew_s'] * 1000:.1f} ms, "
                f"errors {s['errors']}"
            )
        converged = [c for c, _ in runs]
        results = [r for _, r in runs]
        table.append(
            {
                "workers": n,
                "runs": len(runs),
                "converge_s_p50": round(statistics.median(converged), 3),
                "converge_s_max": round(max(converged), 3),
                "last_doc_s_p50": round(
                    statistics.median(max(r.sim["doc_s"], default=float("nan")) for r in results),
                    3,
                ),
                "join_p99_ms": round(
                    statistics.median(common.percentile(r.sim["join_s"], 99) for r in results)
                    * 1000,
                    1,
                ),
                "master_cpu_s_p50": round(statistics.median(r.master_cpu_s for r in results), 2),
                "master_cpu_total_s_p50": round(
                    statistics.median(r.master_cpu_total_s for r in results), 2
                ),
                "master_hwm_mb_max": round(max(r.master_hwm_mb for r in results), 1),
                "master_ready_s_p50": round(
                    statistics.median(
                        r.master_ready_s if r.master_ready_s is not None else float("nan")
                        for r in results
                    ),
                    3,
                ),
                "doc_kib": round(results[0].sim["doc_bytes"] / 1024, 1),
                "doc_wire_kib": round(results[0].sim["doc_wire_bytes"] / 1024, 1),
                "sim_cpu_s_p50": statistics.median(r.sim["sim_cpu_s"] for r in results),
                "sim_procs": args.procs,
                "load_avg_1m": round(os.getloadavg()[0], 1),
                "failures": sum(
                    n - r.sim["verified_ok"] + (0 if r.sim["docs_identical"] else 1)
                    for r in results
                ),
            }
        )

    print(
        f"\n{'workers':>7} {'converge p50 s':>14} {'master CPU s':>12} {'VmHWM MB':>9} "
        f"{'doc KiB':>8} {'sim CPU s':>9} {'failures':>8}"
    )
    for row in table:
        print(
            f"{row['workers']:7d} {row['converge_s_p50']:14.3f} {row['master_cpu_s_p50']:12.2f} "
            f"{row['master_hwm_mb_max']:9.1f} {row['doc_kib']:8.0f} {row['sim_cpu_s_p50']:9.2f} "
            f"{row['failures']:8d}"
        )
    targets = {}
    big = next((row for row in table if row["workers"] == 4096), None)
    if big is not None:
        targets = {
            "converge_s_4096": {
                "value": big["converge_s_p50"],
                "target": "<= 2",
                "verdict": common.verdict(big["converge_s_p50"] <= 2.0),
            },
            "master_cpu_s_4096": {
                "value": big["master_cpu_s_p50"],
                "target": "< 1",
                "verdict": common.verdict(big["master_cpu_s_p50"] < 1.0),
            },
        }
        for name, t in targets.items():
            print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict'].upper()}")
    command = "python bench/scale.py" + (
        " --quick"
        if args.quick
        else f" --sizes {' '.join(map(str, args.sizes))} --runs {args.runs}"
        f" --procs {args.procs} --sim-cpus {args.sim_cpus} --timeout {args.timeout:g}"
    )
    common.write_summary(
        "scale-quick"
        if args.quick
        else "scale"
        if tuple(args.sizes) == SIZES
        else "scale-" + "-".join(map(str, args.sizes)),
        {"command": command, "table": table, "targets": targets},
    )
    if not args.no_plot:
        plot(table)


def plot(table: list[dict[str, float]]) -> None:
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = [row["workers"] for row in table]
    ax1.plot(xs, [r["converge_s_p50"] for r in table], "o-", label="convergence (p50)")
    ax1.plot(xs, [r["master_cpu_s_p50"] for r in table], "s-", label="master CPU seconds")
    ax1.axhline(2.0, color="grey", ls="--", lw=1, label="target 2 s")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="simulated workers",
        ylabel="seconds",
        title="one master, N workers",
    )
    ax1.legend()
    ax2.plot(xs, [r["master_hwm_mb_max"] for r in table], "o-")
    ax2.set(
        xscale="log",
        xlabel="simulated workers",
        ylabel="master VmHWM (MB)",
        title="master peak RSS",
    )
    common.save_figure(fig, "scale")


if __name__ == "__main__":
    main()
