"""Footprint: start-to-/livez time, RSS idle and after 100k /env requests, image size.

Start-up is measured from just before the process is spawned to the first 200 on /livez
(polled every 2 ms on fresh connections), interleaved with the bare aiohttp server of
bench/bare_server.py as the floor that Python + aiohttp alone cost. mDNS is off: with it the
sidecar would multicast on this host's interfaces.

    python -m bench.footprint            # 20 starts, 100k requests
    python -m bench.footprint --quick    # 5 starts, 20k requests
    python -m bench.footprint --starts-only --against ../old  # A/B: another checkout too

Every start reads byte code, as an installed wheel does: rallypoint's sources (and those of
--against) are byte-compiled first, because with PYTHONDONTWRITEBYTECODE=1 an editable
checkout would otherwise compile each of its modules again at every start.
"""

from __future__ import annotations

import compileall
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.local_api import wrk

IMAGES = ("rallypoint:local", "rallypoint:0.1.0")
#: With --mdns ROLE: a node of a two-host list, as most clusters start.
MDNS_ENV = {
    role: {"RALLYPOINT_HOSTS": "127.0.0.1,127.0.0.2", "RALLYPOINT_NODE_RANK": rank}
    for role, rank in (("master", "0"), ("worker", "1"))
}


def start_time(argv: list[str], port: int, path: str, env: dict[str, str] | None = None) -> float:
    """Seconds from spawn to the first 200 on path; the process is stopped afterwards."""
    t0 = time.monotonic()
    proc = common.spawn(argv, env=env)
    try:
        return common.wait_status(port, path, timeout_s=20.0) - t0
    finally:
        common.stop(proc)


def byte_compile(src: Path) -> None:
    """Write the byte code of the rallypoint package under src (a checkout's src/)."""
    if not compileall.compile_dir(src / "rallypoint", quiet=1):
        raise SystemExit(f"could not byte-compile {src / 'rallypoint'}")


def image_size() -> dict[str, object]:
    """The image's size from `docker image inspect`, when the compose tier built it."""
    if shutil.which("docker") is None:
        return {"measured": False, "why": "docker is not installed"}
    for ref in IMAGES:
        done = subprocess.run(["docker", "image", "inspect", ref], capture_output=True, text=True)
        if done.returncode == 0:
            info = json.loads(done.stdout)[0]
            return {
                "measured": True,
                "image": ref,
                "bytes": info["Size"],
                "mb": round(info["Size"] / 1e6, 1),
                "id": info["Id"][:19],
            }
    return {"measured": False, "why": f"none of {', '.join(IMAGES)} is built"}


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--starts", type=int, default=20)
    p.add_argument("--requests", type=int, default=100_000)
    p.add_argument(
        "--starts-only",
        action="store_true",
        help="only the start-up comparison (no wrk needed): bench/results/footprint-starts.json",
    )
    p.add_argument(
        "--against",
        type=Path,
        metavar="CHECKOUT",
        help="with --starts-only: also start `serve` from this checkout (its src/ first on "
        "PYTHONPATH), interleaved, and report its gap too (an A/B of two versions in one run)",
    )
    p.add_argument(
        "--mdns",
        choices=sorted(MDNS_ENV),
        help="with --starts-only: start `serve` as the default does, mDNS on (on loopback only, "
        "so nothing leaves this host), as this node of a two-host list",
    )
    args = p.parse_args()
    common.can_plot(p, args)
    if args.mdns and not args.starts_only:
        p.error("--mdns needs --starts-only")
    if args.against and not args.starts_only:
        p.error("--against needs --starts-only")
    if args.quick:
        args.starts, args.requests = 5, 20_000
    with common.workdir("rp-bench-") as tmp:
        byte_compile(common.REPO / "src")
        mdns_env = MDNS_ENV[args.mdns] if args.mdns else {}
        side_env = common.quiet_environ(mdns_env)
        other_env = None
        if args.against:
            byte_compile(args.against / "src")
            other_env = common.quiet_environ(
                {"PYTHONPATH": str(args.against.resolve() / "src"), **mdns_env}
            )

        def serve_argv(local_port: int, peer_port: int) -> list[str]:
            argv = common.serve_argv(local_port, peer_port)
            if args.mdns:
                argv[argv.index("--no-mdns")] = "--mdns"
                argv += ["--mdns-interface", "lo"]
            return argv

        # Start-up, interleaved with the bare server so both see the same machine load.
        side_starts, bare_starts, other_starts = [], [], []
        body = tmp / "env.json"
        body.write_text('{"MASTER_ADDR": "127.0.0.1"}')
        for i in range(args.starts):
            lp, pp = common.free_port(), common.free_port()
            side_starts.append(start_time(serve_argv(lp, pp), lp, "/livez", env=side_env))
            bp = common.free_port()
            bare_starts.append(
                start_time(
                    [sys.executable, str(common.BENCH_DIR / "bare_server.py"), str(bp), str(body)],
                    bp,
                    "/env",
                )
            )
            line = (
                f"start {i}: sidecar {side_starts[-1] * 1000:6.0f} ms, "
                f"bare aiohttp {bare_starts[-1] * 1000:6.0f} ms"
            )
            if other_env is not None:
                lp, pp = common.free_port(), common.free_port()
                argv = serve_argv(lp, pp)
                other_starts.append(start_time(argv, lp, "/livez", env=other_env))
                line += f", --against {other_starts[-1] * 1000:6.0f} ms"
            print(line)

        if args.starts_only:
            report_starts(
                side_starts, bare_starts, args.starts, other_starts, args.against, mdns=args.mdns
            )
            return

        # Memory: idle once ready, then after the requests.
        lp, pp = common.free_port(), common.free_port()
        proc = common.spawn(common.serve_argv(lp, pp), log=tmp / "sidecar.log")
        try:
            common.wait_status(lp, "/readyz")
            time.sleep(1.0)
            idle = common.memory_kib(proc.pid)
            cpu_idle = common.cpu_seconds(proc.pid)
            served = 0
            while served < args.requests:
                served += int(wrk(lp, 16, 2)["requests"])
            loaded = common.memory_kib(proc.pid)
            cpu_loaded = common.cpu_seconds(proc.pid)
        finally:
            common.stop(proc)

    start = common.summary(side_starts, 1000)
    bare = common.summary(bare_starts, 1000)
    rss_idle, rss_loaded = idle["VmRSS"] / 1024, loaded["VmRSS"] / 1024
    peak = loaded["VmHWM"] / 1024
    image = image_size()
    worst = max(rss_idle, rss_loaded, peak)
    targets = {
        "rss_mb": {
            "value": round(worst, 1),
            "target": "<= 45",
            "verdict": common.verdict(worst <= 45),
        },
        "start_to_livez_ms_p50": {
            "value": start["p50"],
            "target": "<= 400",
            "verdict": common.verdict(start["p50"] <= 400),
        },
    }
    print(
        f"\nstart to /livez: p50 {start['p50']:.0f} ms p99 {start['p99']:.0f} ms "
        f"(bare aiohttp p50 {bare['p50']:.0f} ms)"
    )
    print(
        f"RSS idle {rss_idle:.1f} MB; after {served} /env requests {rss_loaded:.1f} MB "
        f"(peak {peak:.1f} MB); CPU for the requests {cpu_loaded - cpu_idle:.1f} s"
    )
    print(f"image: {image}")
    for name, t in targets.items():
        print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict']}")
    common.write_summary(
        "footprint",
        {
            "command": "python -m bench.footprint" + (" --quick" if args.quick else ""),
            "start_to_livez_ms": start,
            "bare_aiohttp_start_ms": bare,
            "rss_idle_mb": round(rss_idle, 1),
            "rss_after_requests_mb": round(rss_loaded, 1),
            "rss_peak_mb": round(peak, 1),
            "requests": served,
            "cpu_s_per_10k_requests": round((cpu_loaded - cpu_idle) / served * 1e4, 3),
            "image": image,
            "targets": targets,
        },
    )
    if not args.no_plot:
        plot(side_starts, bare_starts, rss_idle, rss_loaded, peak)


def report_starts(
    side: list[float],
    bare: list[float],
    starts: int,
    other: list[float],
    against: Path | None,
    *,
    mdns: str | None = None,
) -> None:
    """The start-up figures alone, with the gap to the bare server taken start by start."""
    start = common.summary(side, 1000)
    floor = common.summary(bare, 1000)
    gaps = [s - b for s, b in zip(side, bare, strict=True)]
    gap = common.summary(gaps, 1000)
    compared: dict[str, object] = {}
    if against is not None:
        other_start = common.summary(other, 1000)
        other_gap = common.summary([o - b for o, b in zip(other, bare, strict=True)], 1000)
        name = common.checkout_name(against)
        compared = {
            "against": {
                "checkout": name,
                "start_to_livez_ms": other_start,
                "gap_ms": other_gap,
            }
        }
        print(
            f"\n--against {name}: p50 {other_start['p50']:.0f} ms; "
            f"pairwise gap p50 {other_gap['p50']:.0f} ms p99 {other_gap['p99']:.0f} ms"
        )
    targets = {
        "start_gap_ms_p50": {
            "value": gap["p50"],
            "target": "<= 15 (sidecar minus bare aiohttp, pairwise)",
            "verdict": common.verdict(gap["p50"] <= 15),
        },
    }
    print(
        f"\nstart to /livez: p50 {start['p50']:.0f} ms p99 {start['p99']:.0f} ms; bare aiohttp "
        f"p50 {floor['p50']:.0f} ms; pairwise gap p50 {gap['p50']:.0f} ms p99 {gap['p99']:.0f} ms"
    )
    for name, t in targets.items():
        print(f"target {name}: {t['value']} (want {t['target']}): {t['verdict'].upper()}")
    command = f"python -m bench.footprint --starts-only --starts {starts}" + (
        f" --mdns {mdns}" if mdns else ""
    )
    common.write_summary(
        f"footprint-starts-mdns-{mdns}" if mdns else "footprint-starts",
        {
            "command": command + (" --against CHECKOUT" if against else ""),
            "load_avg_1m": round(os.getloadavg()[0], 1),
            "start_to_livez_ms": start,
            "bare_aiohttp_start_ms": floor,
            "gap_ms": gap,
            "targets": targets,
            **compared,
        },
    )


def plot(side: list[float], bare: list[float], idle: float, loaded: float, peak: float) -> None:
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    ax1.boxplot([[s * 1000 for s in side], [b * 1000 for b in bare]])
    ax1.set_xticks([1, 2], ["rallypoint serve", "bare aiohttp"])
    ax1.axhline(400, color="grey", ls="--", lw=1, label="target 400 ms")
    ax1.set(ylabel="spawn to first 200 (ms)", title="start-up")
    ax1.legend()
    ax2.bar(["idle", "after requests", "peak (VmHWM)"], [idle, loaded, peak])
    ax2.axhline(45, color="grey", ls="--", lw=1, label="target 45 MB")
    ax2.set(ylabel="RSS (MB)", title="resident memory")
    ax2.legend()
    common.save_figure(fig, "footprint")


if __name__ == "__main__":
    main()
