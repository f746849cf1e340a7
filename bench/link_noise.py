"""Link figures on a clean cluster: how far the measured links spread with no fault at all.

Starts a namespace cluster (tests/support/cluster/, a session token, default settings:
the data-path checks measure throughput, retransmits and RTT on links.measured_peers),
waits until every node is ready, reads the master's /status ``links`` and
``link_warnings``, and starts over. Per run: the slowest up leg over the best up leg (and
the same for down legs), the largest retransmitted share and the warnings. The thresholds
they are judged by are links.SLOW_SHARE (a leg below that share of the best leg of its kind
is slow) and links.LOSSY_SHARE (a leg retransmitting more is lossy): the margin is how far
the worst clean run stays from them.

All sidecars share this machine's cores, so the legs here are bound by CPU (the sidecars'
and the kernel's copying), not by a link: the spread is the CPU's noise.

    python -m bench.link_noise                      # N = 3 (20 runs) and N = 8 (10 runs)
    python -m bench.link_noise --quick              # N = 3, 2 runs
"""

from __future__ import annotations

import statistics
from typing import Any

from bench import common
from bench.time_to_ready import each_cluster
from rallypoint.core import links


def one_run(cluster: Any, timeout_s: float) -> dict[str, Any]:
    """Start every sidecar, wait until all are ready, read the master's links; stop them."""
    nodes = list(cluster)
    try:
        for node in nodes:
            node.start_sidecar()
        cluster.wait_all_ready(timeout_s)
        status = nodes[0].status()
    finally:
        for node in nodes:
            node.kill_sidecar()
            node.procs.clear()
    measured = status.get("links") or []
    warnings = status.get("link_warnings") or []
    up = [float(link["up_mbps"]) for link in measured]
    down = [float(link["down_mbps"]) for link in measured]
    retrans = [
        float(link[key])
        for link in measured
        for key in ("up_retrans", "down_retrans")
        if link.get(key) is not None
    ]
    rtt = [float(link["rtt_ms"]) for link in measured if link.get("rtt_ms") is not None]
    return {
        "links": len(measured),
        "up_mbps_min": min(up, default=0.0),
        "up_mbps_max": max(up, default=0.0),
        "down_mbps_min": min(down, default=0.0),
        "down_mbps_max": max(down, default=0.0),
        "up_min_over_best": round(min(up) / max(up), 4) if up and max(up) > 0 else None,
        "down_min_over_best": round(min(down) / max(down), 4) if down and max(down) > 0 else None,
        "retrans_max": max(retrans, default=None),
        "rtt_ms_max": max(rtt, default=None),
        "incomplete": sum(1 for link in measured if link.get("complete") is False),
        "warnings": [{"code": w.get("code"), "message": w.get("message")} for w in warnings],
    }


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[3, 8])
    p.add_argument("--runs", type=int, nargs="+", default=[20, 10], help="runs per size")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for ready")
    args = p.parse_args()
    if args.quick:
        args.sizes, args.runs = [3], [2]
    runs_by_size = dict(zip(args.sizes, args.runs + args.runs[-1:] * len(args.sizes), strict=False))
    table = []
    for n, cluster in each_cluster(args.sizes, "link-noise", "rp-noise-"):
        runs = []
        for i in range(runs_by_size[n]):
            run = one_run(cluster, args.timeout)
            runs.append(run)
            print(
                f"N={n} run {i:2d}: {run['links']} links, "
                f"up {run['up_mbps_min']:.0f}-{run['up_mbps_max']:.0f} Mbit/s "
                f"(min/best {run['up_min_over_best']}), "
                f"down {run['down_mbps_min']:.0f}-{run['down_mbps_max']:.0f} Mbit/s "
                f"(min/best {run['down_min_over_best']}), "
                f"retrans max {run['retrans_max']}, rtt max {run['rtt_ms_max']} ms, "
                f"warnings {len(run['warnings'])}",
                flush=True,
            )
        table.append(summarise(n, runs))
    report(table)
    common.write_run_summary(
        "link_noise",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {' '.join(map(str, args.runs))}",
        {"slow_share": links.SLOW_SHARE, "lossy_share": links.LOSSY_SHARE, "table": table},
    )


def summarise(n: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size: the worst run against each threshold, the margins and every run."""
    ratios = [r[key] for r in runs for key in ("up_min_over_best", "down_min_over_best") if r[key]]
    up = [r["up_min_over_best"] for r in runs if r["up_min_over_best"] is not None]
    down = [r["down_min_over_best"] for r in runs if r["down_min_over_best"] is not None]
    retrans = [r["retrans_max"] for r in runs if r["retrans_max"] is not None]
    worst_ratio = min(ratios, default=None)
    worst_retrans = max(retrans, default=None)
    return {
        "nnodes": n,
        "runs": len(runs),
        "runs_with_warnings": sum(1 for r in runs if r["warnings"]),
        "warnings_total": sum(len(r["warnings"]) for r in runs),
        "warning_codes": sorted({w["code"] for r in runs for w in r["warnings"]}),
        "up_min_over_best_p50": statistics.median(up) if up else None,
        "down_min_over_best_p50": statistics.median(down) if down else None,
        "worst_min_over_best": worst_ratio,
        # > 1: clear of SLOW_SHARE by that factor; < 1: a clean run fell below it.
        "slow_margin": None if worst_ratio is None else round(worst_ratio / links.SLOW_SHARE, 2),
        "worst_retrans": worst_retrans,
        "lossy_margin": None if not worst_retrans else round(links.LOSSY_SHARE / worst_retrans, 1),
        "per_run": runs,
    }


def report(table: list[dict[str, Any]]) -> None:
    print(
        f"\n{'N':>3} {'runs':>4} {'warned':>6} {'up min/best p50':>15} {'down min/best p50':>17} "
        f"{'worst':>6} {'slow margin':>11} {'max retrans':>11} {'lossy margin':>12}"
    )
    for row in table:
        print(
            f"{row['nnodes']:3d} {row['runs']:4d} {row['runs_with_warnings']:6d} "
            f"{row['up_min_over_best_p50']!s:>15} {row['down_min_over_best_p50']!s:>17} "
            f"{row['worst_min_over_best']!s:>6} {row['slow_margin']!s:>11} "
            f"{row['worst_retrans']!s:>11} {row['lossy_margin']!s:>12}"
        )
    print(f"thresholds: SLOW_SHARE {links.SLOW_SHARE}, LOSSY_SHARE {links.LOSSY_SHARE}")


if __name__ == "__main__":
    main()
