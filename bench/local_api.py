"""Local API throughput: GET /env on a ready single-node sidecar against a bare aiohttp handler.

Both servers run pinned to CPU 0 and wrk (one thread, keep-alive) to CPU 1, so the load
generator does not steal the server's core. Each round measures every connection count on
both servers back to back (the order alternates between rounds); the ratio is taken per
round, then the median over rounds is reported.

    python -m bench.local_api            # 3 rounds x 5 s per point
    python -m bench.local_api --quick    # 1 round x 2 s
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys

from bench import common

CONNECTIONS = (1, 16, 64)
LUA = common.BENCH_DIR / "wrk_report.lua"


def wrk(port: int, connections: int, duration_s: float) -> dict[str, float]:
    """One wrk run against /env; its JSON report plus requests per second."""
    argv = [
        "taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{round(duration_s)}s",
        "--latency", "-s", str(LUA), f"http://127.0.0.1:{port}/env",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    line = next(text for text in out.splitlines() if text.startswith("{"))
    report: dict[str, float] = json.loads(line)
    report["rps"] = report["requests"] / (report["duration_us"] / 1e6)
    return report


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=int, default=5, help="seconds per wrk run")
    args = p.parse_args()
    common.can_plot(p, args)
    if args.quick:
        args.rounds, args.duration = 1, 2
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed: apt-get install wrk")

    with common.workdir("rp-bench-") as tmp:
        side_port, peer_port, bare_port = common.free_port(), common.free_port(), common.free_port()
        sidecar = common.spawn(
            common.serve_argv(side_port, peer_port), cpus="0", log=tmp / "sidecar.log"
        )
        bare = None
        try:
            common.wait_status(side_port, "/readyz")
            status, body = common.get(side_port, "/env")
            assert status == 200, body
            (tmp / "env.json").write_bytes(body)
            bare = common.spawn(
                [sys.executable, str(common.BENCH_DIR / "bare_server.py"), str(bare_port),
                 str(tmp / "env.json")], cpus="0")  # fmt: skip
            common.wait_status(bare_port, "/env")
            _, bare_body = common.get(bare_port, "/env")
            assert len(bare_body) == len(body)
            # Warm both up (first requests pay for lazy imports and allocations).
            wrk(side_port, 16, 1)
            wrk(bare_port, 16, 1)
            runs: dict[int, list[dict[str, dict[str, float]]]] = {c: [] for c in CONNECTIONS}
            for rnd in range(args.rounds):
                for conns in CONNECTIONS:
                    order = ("sidecar", "bare") if rnd % 2 == 0 else ("bare", "sidecar")
                    pair = {}
                    for name in order:
                        pair[name] = wrk(
                            side_port if name == "sidecar" else bare_port, conns, args.duration
                        )
                    runs[conns].append(pair)
                    s, b = pair["sidecar"], pair["bare"]
                    print(
                        f"round {rnd} c={conns:3d}: sidecar {s['rps']:8.0f} rps "
                        f"p99 {s['p99_us'] / 1000:6.2f} ms | bare {b['rps']:8.0f} rps "
                        f"p99 {b['p99_us'] / 1000:6.2f} ms | ratio {s['rps'] / b['rps']:.2f}"
                    )
        finally:
            common.stop(sidecar)
            if bare is not None:
                common.stop(bare)

    table = []
    for conns in CONNECTIONS:
        pairs = runs[conns]

        def med(name: str, key: str, pairs: list[dict[str, dict[str, float]]] = pairs) -> float:
            return statistics.median(pair[name][key] for pair in pairs)

        row = {
            "connections": conns,
            "sidecar_rps": round(med("sidecar", "rps")),
            "sidecar_p50_ms": round(med("sidecar", "p50_us") / 1000, 3),
            "sidecar_p99_ms": round(med("sidecar", "p99_us") / 1000, 3),
            "bare_rps": round(med("bare", "rps")),
            "bare_p50_ms": round(med("bare", "p50_us") / 1000, 3),
            "bare_p99_ms": round(med("bare", "p99_us") / 1000, 3),
            "ratio": round(
                statistics.median(pair["sidecar"]["rps"] / pair["bare"]["rps"] for pair in pairs), 3
            ),
            "errors": int(
                sum(
                    pair[n]["errors"] + pair[n]["non2xx"]
                    for pair in pairs
                    for n in ("sidecar", "bare")
                )
            ),
        }
        table.append(row)
    top = table[-1]
    targets = {
        "ratio_at_64": common.target(top["ratio"], ">= 0.8", top["ratio"] >= 0.8),
        "p99_ms_at_64": common.target(top["sidecar_p99_ms"], "< 5", top["sidecar_p99_ms"] < 5.0),
    }
    print(
        f"\n{'conns':>5} {'sidecar rps':>12} {'p99 ms':>7} {'bare rps':>9} {'p99 ms':>7} "
        f"{'ratio':>6}"
    )
    for row in table:
        print(
            f"{row['connections']:5d} {row['sidecar_rps']:12d} {row['sidecar_p99_ms']:7.2f} "
            f"{row['bare_rps']:9d} {row['bare_p99_ms']:7.2f} {row['ratio']:6.2f}"
        )
    common.print_targets(targets)
    common.write_summary(
        "local_api",
        {
            "command": "python -m bench.local_api" + (" --quick" if args.quick else ""),
            "rounds": args.rounds,
            "duration_s": args.duration,
            "body_bytes": len(body),
            "table": table,
            "targets": targets,
        },
    )
    if not args.no_plot:
        plot(table)


def plot(table: list[dict[str, float]]) -> None:
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = range(len(table))
    labels = [str(row["connections"]) for row in table]
    w = 0.38
    for ax, key, ours, ylabel, title in (
        (ax1, "rps", "rallypoint /env", "requests / s", "/env throughput (median of rounds)"),
        (ax2, "p99_ms", "rallypoint", "p99 latency (ms)", "/env p99 latency"),
    ):
        ax.bar([x - w / 2 for x in xs], [r[f"sidecar_{key}"] for r in table], w, label=ours)
        ax.bar([x + w / 2 for x in xs], [r[f"bare_{key}"] for r in table], w, label="bare aiohttp")
        if key == "p99_ms":
            ax.axhline(5.0, color="grey", ls="--", lw=1, label="target 5 ms")
        ax.set(
            xticks=list(xs),
            xticklabels=labels,
            xlabel="keep-alive connections",
            ylabel=ylabel,
            title=title,
        )
        ax.legend()
    common.save_figure(fig, "local_api")


if __name__ == "__main__":
    main()
