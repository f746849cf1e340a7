"""What the connection checks add to time to ready: with and without them, side by side.

The same namespace clusters and scenarios as time_to_ready.py (master last, worker last),
N = 8 and 16; every run measures rallypoint with its default checks (names, connections,
the master's cluster-wide verdict) and then with ``--no-probe`` (names only, the verdict
still collected), interleaved so that both see the same machine load.

    python bench/checks_cost.py                  # N = 8 16, 10 runs each
    python bench/checks_cost.py --quick          # N = 8, 2 runs
"""

from __future__ import annotations

import statistics

import common
from time_to_ready import each_cluster, one_run

VARIANTS = {"checks": (), "no_probe": ("--no-probe",)}


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 16])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--wait", type=float, default=3.0, help="seconds the others wait first")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.runs = [8], 2
    table = []
    for n, cluster in each_cluster(args.sizes, "checks-cost", "rp-cost-"):
        for scenario in ("master_last", "worker_last"):
            samples: dict[str, dict[str, list[float]]] = {v: {} for v in VARIANTS}
            for i in range(args.runs):
                for variant, extra in VARIANTS.items():
                    run = one_run(cluster, scenario, args.wait, extra)
                    for key in ("rallypoint_from_spawn", "rallypoint_from_livez"):
                        samples[variant].setdefault(key, []).append(run[key])
                    print(
                        f"N={n:2d} {scenario:11s} run {i:2d} {variant:8s}: "
                        f"from livez {run['rallypoint_from_livez'] * 1000:6.0f} ms, "
                        f"from spawn {run['rallypoint_from_spawn'] * 1000:6.0f} ms",
                        flush=True,
                    )
            row: dict[str, object] = {"nnodes": n, "scenario": scenario, "runs": args.runs}
            for variant, by_key in samples.items():
                for key, values in by_key.items():
                    row[f"{variant}_{key}"] = common.summary(values, 1000)
            added = statistics.median(
                samples["checks"]["rallypoint_from_livez"]
            ) - statistics.median(samples["no_probe"]["rallypoint_from_livez"])
            row["checks_add_from_livez_p50_ms"] = round(added * 1000, 1)
            table.append(row)
    print(f"\n{'N':>3} {'scenario':11s} {'checks p50':>10} {'no-probe p50':>12} {'added':>7}")
    for row in table:
        with_checks = row["checks_rallypoint_from_livez"]["p50"]  # type: ignore[index]
        without = row["no_probe_rallypoint_from_livez"]["p50"]  # type: ignore[index]
        print(
            f"{row['nnodes']:3d} {row['scenario']:11s} {with_checks:10.0f} {without:12.0f} "
            f"{row['checks_add_from_livez_p50_ms']:7.1f}"
        )
    targets = {
        f"n8_{row['scenario']}_added_p50_ms": common.target(
            row["checks_add_from_livez_p50_ms"],
            "<= 20",
            float(row["checks_add_from_livez_p50_ms"]) <= 20,  # type: ignore[arg-type]
        )
        for row in table
        if row["nnodes"] == 8
    }
    common.print_targets(targets)
    common.write_run_summary(
        "checks_cost",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs} --wait {args.wait:g}",
        {"table": table, "targets": targets},
    )


if __name__ == "__main__":
    main()
