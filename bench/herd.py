"""Herd: 2000 simulated workers join one master at the same instant (NNODES = 2001).

Every simulated worker opens its own connection and POSTs a signed /v1/join at once
(bench/simpeers.py --no-poll); join latency runs from the connect attempt to the answer.
Needs root (network namespaces).

    python -m bench.herd                # 2000 workers, 3 runs
    python -m bench.herd --quick        # 500 workers, 1 run
"""

from __future__ import annotations

from bench import common, simcluster


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--workers", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    common.can_plot(p, args)
    if args.quick:
        args.workers, args.runs = 500, 1
    reason = simcluster.prerequisites()
    if reason is not None:
        raise SystemExit(f"herd benchmark needs network namespaces: {reason}")
    latencies: list[float] = []
    failures = 0
    errors: dict[str, int] = {}
    cpu = []
    overflows = []
    for i in range(args.runs):
        r = simcluster.simulate(args.workers, poll=False)
        s = r.sim
        failed = args.workers - s["join_ok"]
        failures += failed
        for key, count in s["errors"].items():
            errors[key] = errors.get(key, 0) + count
        latencies.extend(s["join_s"])
        cpu.append(r.master_cpu_s)
        overflows.append(r.listen_overflows)
        stats = common.summary(s["join_s"], 1000)
        print(
            f"run {i}: {s['join_ok']}/{args.workers} joins succeeded, p50 {stats['p50']} ms, "
            f"p99 {stats['p99']} ms, max {stats['max']} ms, master CPU {r.master_cpu_s:.2f} s, "
            f"accept-queue overflows {r.listen_overflows}, SYN drops {r.listen_drops}"
        )
    stats = common.summary(latencies, 1000)
    targets = {
        "failures": {"value": failures, "target": "0", "verdict": common.verdict(failures == 0)},
        "join_p99_ms": {
            "value": stats["p99"],
            "target": "< 1000",
            "verdict": common.verdict(stats["p99"] < 1000),
        },
    }
    print(f"\nall runs: {stats}; failures {failures} {errors}")
    for name, t in targets.items():
        print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict']}")
    command = "python -m bench.herd" + (" --quick" if args.quick else "")
    common.write_summary(
        "herd" if not args.quick else "herd-quick",
        {
            "command": command,
            "workers": args.workers,
            "runs": args.runs,
            "join_ms": stats,
            "failures": failures,
            "errors": errors,
            "master_cpu_s": [round(c, 2) for c in cpu],
            "listen_overflows": overflows,
            "targets": targets,
        },
    )
    if not args.no_plot:
        plot(latencies)


def plot(latencies: list[float]) -> None:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ms = sorted(x * 1000 for x in latencies)
    ax.plot(ms, [100 * (i + 1) / len(ms) for i in range(len(ms))])
    ax.axvline(1000, color="grey", ls="--", lw=1, label="target p99 1 s")
    ax.set(xlabel="join latency (ms)", ylabel="% of joins", title="2000 joins at once: CDF")
    ax.legend()
    common.save_figure(fig, "herd")


if __name__ == "__main__":
    main()
