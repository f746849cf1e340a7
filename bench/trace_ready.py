"""Where the time from the last node's /livez to ready goes: one node's phases per run.

Runs the scenarios of time_to_ready.py with `--log-format json --verbose` and prints, per
run, every node's timeline relative to the last node's first /livez answer (document
received, names checked, probes done, verdict answered, ready, and what else the
rendezvous logged), then the CPU each sidecar used in that window (/proc, all threads)
beside the window times the machine's cores: when the sum comes close, the rendezvous is
CPU-bound and only less work per node shortens it.

    python -m bench.trace_ready --size 8 --scenario worker_last --runs 3
    python -m bench.trace_ready --cpu-only --runs 10   # no debug logs: CPU and window only

The window cannot be shorter than the busiest sidecar's CPU in it (the master's, whose
event loop serves every node), nor than the sum over all sidecars divided by the cores.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from bench import common
from bench.time_to_ready import each_cluster, one_run
from tests.support.cluster.nodes import Node

#: The events shown; the rest of the debug log is left out.
EVENTS = (
    "joined",
    "cluster_document",
    "names_checked",
    "probes_done",
    "verdict_answered",
    "ready",
    "mdns_master_changed",
    "verification_retry",
    "master_lost",
)


def sidecar_cpu_s(node: Node) -> float:
    """CPU seconds of every thread of the node's sidecar.

    Its pid is the sidecar's own (the namespace wrapper execs it). Only that process's
    threads are read: scanning /proc for its session took tens of ms per node on this
    machine, so the snapshots of later nodes were late, and the scan itself competed with
    the sidecars inside the window it measured.
    """
    assert node.sidecar is not None
    return _cpu_s(node.sidecar.pid)


def _cpu_s(pid: int) -> float:
    """Nanosecond-precise run time from /proc/PID/task/*/sched where the kernel has it,
    else the user + system ticks of /proc/PID/stat."""
    total = 0.0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{task}/sched").read_text()
            line = next(t for t in text.splitlines() if t.startswith("se.sum_exec_runtime"))
            total += float(line.split()[-1]) / 1000  # milliseconds
    except (OSError, StopIteration):
        return common.cpu_seconds(pid)
    return total


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--size", type=int, default=8)
    p.add_argument("--scenario", default="worker_last", choices=("master_last", "worker_last"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--wait", type=float, default=3.0, help="seconds the others wait first")
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="info-level logs (what the sidecars log by default): no timeline, CPU only",
    )
    args = p.parse_args()
    logs = ("--log-format", "json") if args.cpu_only else ("--log-format", "json", "--verbose")
    summary: list[dict[str, float]] = []
    offset = time.time() - time.monotonic()  # the sidecars log wall-clock time
    for _, cluster in each_cluster([args.size], "trace", "rp-trace-"):
        for i in range(args.runs):
            marks: dict[str, dict[str, float]] = {}
            cpu: list[dict[str, float]] = []
            nodes = list(cluster)

            def snapshot(nodes: list[Node] = nodes, cpu: list[dict[str, float]] = cpu) -> None:
                cpu.append({n.name: sidecar_cpu_s(n) for n in nodes})

            run = one_run(
                cluster,
                args.scenario,
                args.wait,
                logs,
                marks_out=marks,
                hooks=(snapshot, snapshot),
            )
            live = max(m["live"] for m in marks.values() if "live" in m)
            window = max(m["ready"] for m in marks.values()) - live
            print(f"=== run {i}: {run['rallypoint_from_livez'] * 1000:.0f} ms from the last /livez")
            rows = []
            for node in () if args.cpu_only else cluster:
                for line in node.sidecar.log().splitlines() if node.sidecar else ():
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if record.get("event") not in EVENTS:
                        continue
                    at = (record["ts"] - offset - live) * 1000
                    extra = {
                        k: v
                        for k, v in record.items()
                        if k not in ("ts", "level", "logger", "event", "generation")
                    }
                    if -50 < at < window * 1000 + 50:
                        rows.append((at, node.name, record["event"], extra))
            for node in cluster:
                rows.append(
                    ((marks[node.name]["ready"] - live) * 1000, node.name, "(seen ready)", {})
                )
            for at, name, event, extra in sorted(rows):
                print(f"{at:8.1f} ms {name:6s} {event} {extra or ''}")
            used = {name: (cpu[1][name] - cpu[0].get(name, 0.0)) * 1000 for name in cpu[1]}
            summary.append(
                {
                    "window_ms": window * 1000,
                    "busiest_ms": max(used.values()),
                    "sum_ms": sum(used.values()),
                }
            )
            print(
                "CPU in the window, ms: "
                + ", ".join(f"{name} {ms:.0f}" for name, ms in used.items())
                + f"; sum {sum(used.values()):.0f} ms, window x cores "
                f"{window * 1000 * (os.cpu_count() or 1):.0f} ms"
            )
    cores = os.cpu_count() or 1
    for key in ("window_ms", "busiest_ms", "sum_ms"):
        values = sorted(run[key] for run in summary)
        p50, low, high = values[len(values) // 2], values[0], values[-1]
        print(f"{key}: p50 {p50:.0f}, min {low:.0f}, max {high:.0f}")
    bound = sorted(max(r["busiest_ms"], r["sum_ms"] / cores) for r in summary)
    print(
        f"lower bound of the window from CPU (max of busiest, sum / {cores} cores): "
        f"p50 {bound[len(bound) // 2]:.0f} ms, min {bound[0]:.0f} ms"
    )


if __name__ == "__main__":
    main()
