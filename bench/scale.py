"""Scale: one real master sidecar against N simulated workers (bench/simcluster.py).

Convergence is the time from the moment all N simulated workers start (each joins,
long-polls /v1/cluster, then reports its checks and long-polls the master's verdict, on one
keep-alive connection) until the last one holds a verified verdict: every node would be
ready. The time until the last one held the document is reported beside it. A run counts
only when every worker got the same document bytes and that document lists every node.
Master CPU is utime + stime from /proc/<pid>/stat over that interval; peak RSS is its
VmHWM. Needs root (network namespaces).

Two modes, interleaved run by run: ``tree``, the sidecars as they run by default (from 512
nodes the fan-out tree of docs/scale.md: simulated relays speak to the master as a relay
does, and one group is served by a real relay sidecar in its own namespace, so a real
relay's hop is on the measured path), and ``direct`` (``--relay-group 0``: every simulated
worker joins the master itself).

    python -m bench.scale                    # N = 64, 512, 1024, 4096, 3 runs each
    python -m bench.scale --sizes 16384 --runs 1   # stretch
    python -m bench.scale --quick            # N = 64, 512, one run each
    python -m bench.scale --procs 2          # the simulator as 2 processes (both on CPU 1)
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench import common, simcluster

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
    p.add_argument(
        "--modes",
        nargs="+",
        choices=("tree", "direct"),
        default=["tree", "direct"],
        help="tree: the fan-out tree as the sidecars choose it (auto); direct: --relay-group 0; "
        "both are interleaved run by run",
    )
    args = p.parse_args()
    common.can_plot(p, args)
    sim_cpus = frozenset(int(c) for c in args.sim_cpus.split(","))
    if args.quick:
        args.sizes, args.runs = [64, 512], 1
    reason = simcluster.prerequisites()
    if reason is not None:
        raise SystemExit(f"scale benchmark needs network namespaces: {reason}")

    table = []
    for n in args.sizes:
        by_mode: dict[str, list[tuple[float, simcluster.SimResult]]] = {m: [] for m in args.modes}
        for i in range(args.runs):
            for mode in args.modes if i % 2 == 0 else reversed(args.modes):
                by_mode[mode].append(run_once(n, mode, i, args, sim_cpus))
        for mode, runs in by_mode.items():
            table.append(row(n, mode, runs, args.procs))
    print_table(table)
    targets = {}
    for n, name, limit in ((4096, "converge_s_4096", 2.0), (16384, "converge_s_16384", 5.0)):
        tree = next((r for r in table if r["workers"] == n and r["mode"] == "tree"), None)
        if tree is None:
            continue
        targets[name] = {
            "value": tree["converge_s_p50"],
            "target": f"<= {limit:g}",
            "verdict": common.verdict(tree["converge_s_p50"] <= limit),
        }
        targets[name.replace("converge_s", "master_cpu_s")] = {
            "value": tree["master_cpu_s_p50"],
            "target": "< 1" if n == 4096 else "(reported)",
            "verdict": common.verdict(tree["master_cpu_s_p50"] < 1.0) if n == 4096 else "info",
        }
    for name, t in targets.items():
        print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict'].upper()}")
    command = "python -m bench.scale" + (
        " --quick"
        if args.quick
        else f" --sizes {' '.join(map(str, args.sizes))} --runs {args.runs}"
        f" --procs {args.procs} --sim-cpus {args.sim_cpus} --timeout {args.timeout:g}"
        f" --modes {' '.join(args.modes)}"
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


def run_once(
    n: int, mode: str, i: int, args: Any, sim_cpus: frozenset[int]
) -> tuple[float, simcluster.SimResult]:
    """One simulated run; its convergence (NaN unless every node verified one document)."""
    r = simcluster.simulate(
        n, procs=args.procs, sim_cpus=sim_cpus, timeout_s=args.timeout, tree=mode == "tree"
    )
    s = r.sim
    converge, doc_s = r.converge_s, r.last_doc_s
    print(
        f"N={n:5d} {mode:6s} run {i}: group {r.relay_group}, real relay {r.real_relay} "
        f"(ready {r.real_relay_ready_s}, CPU {r.real_relay_cpu_s:.2f} s), "
        f"joined {s['join_ok']}/{n}, documents {s['doc_ok']}/{n} "
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
    return converge, r


def row(
    n: int, mode: str, runs: list[tuple[float, simcluster.SimResult]], procs: int
) -> dict[str, Any]:
    converged = [c for c, _ in runs]
    results = [r for _, r in runs]
    return {
        "workers": n,
        "mode": mode,
        "relay_group": results[0].relay_group,
        "real_relay_cpu_s_p50": round(statistics.median(r.real_relay_cpu_s for r in results), 2),
        "runs": len(runs),
        "converge_s_p50": round(statistics.median(converged), 3),
        "converge_s_max": round(max(converged), 3),
        "last_doc_s_p50": round(
            statistics.median(max(r.sim["doc_s"], default=float("nan")) for r in results),
            3,
        ),
        "join_p99_ms": round(
            statistics.median(common.percentile(r.sim["join_s"], 99) for r in results) * 1000,
            1,
        ),
        "master_cpu_s_p50": round(statistics.median(r.master_cpu_s for r in results), 2),
        "master_cpu_total_s_p50": round(
            statistics.median(r.master_cpu_total_s for r in results), 2
        ),
        "master_hwm_mb_max": round(max(r.master_hwm_mb for r in results), 1),
        "master_ready_s_p50": round(
            statistics.median(
                r.master_ready_s if r.master_ready_s is not None else float("nan") for r in results
            ),
            3,
        ),
        "doc_kib": round(results[0].sim["doc_bytes"] / 1024, 1),
        "doc_wire_kib": round(results[0].sim["doc_wire_bytes"] / 1024, 1),
        "sim_cpu_s_p50": statistics.median(r.sim["sim_cpu_s"] for r in results),
        "sim_procs": procs,
        "load_avg_1m": round(os.getloadavg()[0], 1),
        "failures": sum(0 if c == c else 1 for c in converged),
    }


def print_table(table: list[dict[str, Any]]) -> None:
    print(
        f"\n{'workers':>7} {'mode':>6} {'converge p50 s':>14} {'master CPU s':>12} "
        f"{'VmHWM MB':>9} {'doc KiB':>8} {'sim CPU s':>9} {'failures':>8}"
    )
    for r in table:
        print(
            f"{r['workers']:7d} {r['mode']:>6} {r['converge_s_p50']:14.3f} "
            f"{r['master_cpu_s_p50']:12.2f} {r['master_hwm_mb_max']:9.1f} {r['doc_kib']:8.0f} "
            f"{r['sim_cpu_s_p50']:9.2f} {r['failures']:8d}"
        )


def plot(table: list[dict[str, Any]]) -> None:
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for mode, style in (("tree", "-"), ("direct", ":")):
        rows = [r for r in table if r["mode"] == mode]
        if not rows:
            continue
        xs = [r["workers"] for r in rows]
        ax1.plot(xs, [r["converge_s_p50"] for r in rows], "o" + style, label=f"{mode}: converged")
        ax1.plot(xs, [r["master_cpu_s_p50"] for r in rows], "s" + style, label=f"{mode}: CPU s")
        ax2.plot(xs, [r["master_hwm_mb_max"] for r in rows], "o" + style, label=mode)
    ax1.axhline(2.0, color="grey", ls="--", lw=1, label="target 2 s")
    ax1.set(
        xscale="log",
        yscale="log",
        xlabel="simulated workers",
        ylabel="seconds",
        title="one master, N workers",
    )
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    ax2.set(
        xscale="log",
        xlabel="simulated workers",
        ylabel="master VmHWM (MB)",
        title="master peak RSS",
    )
    common.save_figure(fig, "scale")


if __name__ == "__main__":
    main()
