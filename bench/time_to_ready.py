"""Time to ready on a network-namespace cluster (tests/support/cluster/), N = 2..16.

Two scenarios per run, each with rallypoint and two baseline waits side by side:

* master last: the workers' sidecars are up (and the baselines waiting) while the master's
  name does not resolve anywhere; at t0 the master's hosts entry appears on every node and
  the master's sidecar is spawned.
* worker last: the master and the other workers run for --wait seconds (10) while the last
  worker's name does not resolve; at t0 its entry appears and its sidecar is spawned.

rallypoint's "ready" is the moment the last node's /env?wait answers 200 (the same flag as
/readyz; a long-poll instead of polling, so no poll interval is added). Two figures are kept:
from t0 (the spawn: includes Python start-up, see footprint.py) and from the moment the
last node's /livez first answered (the rendezvous alone). For the baselines "ready" is when
the last loop exits, measured from t0 (when the name became resolvable). Sidecars run with
default settings, a session token and mDNS on (multicast stays on the private bridge).

    python -m bench.time_to_ready                     # N = 2 4 8 16, 20 runs each
    python -m bench.time_to_ready --runs 5 --sizes 8  # fewer
    python -m bench.time_to_ready --quick             # N = 2 4, 2 runs, 3 s wait
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator

from bench import common
from tests.support.cluster.build import Cluster
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.netio import http_get
from tests.support.cluster.nodes import Node
from tests.support.cluster.procs import Proc
from tests.support.cluster.runs import prerequisites, sweep_stale
from tests.support.netns import wait_for

TOKEN = "bench-session-secret"
BASELINE = common.BENCH_DIR / "baseline_wait.py"


def exit_time(proc: Proc, timeout_s: float) -> float:
    """The monotonic time a baseline loop printed when it finished."""
    proc.wait(timeout_s)
    line = next(t for t in proc.log().splitlines() if t.startswith("done "))
    return float(line.split()[1])


def started(proc: Proc) -> bool:
    return "started" in proc.log()


def watch(
    node: Node,
    out: dict[str, float],
    spawned: bool,
    on_live: Callable[[], None] | None = None,
) -> None:
    """Record when node first answers /livez (if spawned) and when it turns ready."""
    if spawned:
        while node.try_get("/livez", timeout_s=1) is None:
            time.sleep(0.002)
        out["live"] = time.monotonic()
        if on_live is not None:
            on_live()
    while True:
        try:
            reply = http_get(node.ns, "127.0.0.1", LOCAL_PORT, "/env?wait=60", timeout_s=70)
        except OSError:
            time.sleep(0.005)
            continue
        if reply.status == 200:
            out["ready"] = time.monotonic()
            return


def one_run(
    cluster: Cluster,
    scenario: str,
    wait_s: float,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    marks_out: dict[str, dict[str, float]] | None = None,
    hooks: tuple[Callable[[], None], Callable[[], None]] | None = None,
) -> dict[str, float]:
    """One measurement; ``args`` and ``env`` go to every `rallypoint serve` (checks_cost.py
    varies them, and runs another checkout's code with PYTHONPATH in ``env``); ``marks_out``
    receives each node's monotonic "live" (the last node) and "ready" times; ``hooks`` run
    when the last node first answered /livez and once every node is ready (trace_ready.py)."""
    nodes = list(cluster)
    last = nodes[0] if scenario == "master_last" else nodes[-1]
    master = nodes[0].name
    hosts = [n.name for n in nodes]
    for node in nodes:
        node.drop_host(last.name)
    early = [n for n in nodes if n is not last]
    baselines = []
    for node in early:
        node.start_sidecar(args, env=env)
        baselines.append(
            node.spawn([sys.executable, str(BASELINE), "kubeflow", master], label="kubeflow")
        )
        baselines.append(
            node.spawn([sys.executable, str(BASELINE), "sagemaker", *hosts], label="sagemaker")
        )
    for node in early:
        wait_for(
            lambda node=node: node.try_get("/livez"),
            timeout_s=60,
            interval_s=0.02,
            what=f"{node.name} /livez",
        )
    wait_for(
        lambda: all(started(p) for p in baselines),
        timeout_s=30,
        interval_s=0.02,
        what="baselines started",
    )
    if scenario == "worker_last":
        time.sleep(wait_s)
    marks: dict[str, dict[str, float]] = {n.name: {} for n in nodes}
    if marks_out is not None:
        marks_out.update(marks)  # the same dicts: each node's "live" and "ready" land there
    on_live = None if hooks is None else hooks[0]
    threads = [
        threading.Thread(target=watch, args=(n, marks[n.name], n is last, on_live)) for n in nodes
    ]
    for node in nodes:
        node.unpin()
    t0 = time.monotonic()
    last.start_sidecar(args, env=env)
    late = [
        last.spawn([sys.executable, str(BASELINE), "kubeflow", master], label="kubeflow"),
        last.spawn([sys.executable, str(BASELINE), "sagemaker", *hosts], label="sagemaker"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    if hooks is not None:
        hooks[1]()
    ready = max(m["ready"] for m in marks.values())
    everything = baselines + late
    kubeflow = max(exit_time(p, 60) for p in everything if p.name.endswith("kubeflow"))
    sagemaker = max(exit_time(p, 60) for p in everything if p.name.endswith("sagemaker"))
    for node in nodes:
        node.kill_sidecar()
        node.procs.clear()
    return {
        "rallypoint_from_spawn": ready - t0,
        "rallypoint_from_livez": ready - marks[last.name]["live"],
        "kubeflow": kubeflow - t0,
        "sagemaker": sagemaker - t0,
    }


def each_cluster(sizes: list[int], benchmark: str, prefix: str) -> Iterator[tuple[int, Cluster]]:
    """A namespace cluster of each size (main1, sub1 ...) with a session token, torn down after.

    Exits saying why when network namespaces are unavailable.
    """
    reason = prerequisites()
    if reason is not None:
        raise SystemExit(f"{benchmark} benchmark needs network namespaces: {reason}")
    sweep_stale()
    for n in sizes:
        hosts = ["main1", *(f"sub{i}" for i in range(1, n))]
        with (
            common.workdir(prefix) as workdir,
            Cluster(hosts, workdir, sidecar_env={"RALLYPOINT_TOKEN": TOKEN}) as cluster,
        ):
            yield n, cluster


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--wait", type=float, default=10.0, help="seconds the others wait first")
    args = p.parse_args()
    common.can_plot(p, args)
    if args.quick:
        args.sizes, args.runs, args.wait = [2, 4], 2, 3.0
    table = []
    for n, cluster in each_cluster(args.sizes, "time-to-ready", "rp-ttr-"):
        for scenario in ("master_last", "worker_last"):
            samples: dict[str, list[float]] = {}
            for i in range(args.runs):
                run = one_run(cluster, scenario, args.wait)
                for key, value in run.items():
                    samples.setdefault(key, []).append(value)
                print(
                    f"N={n:2d} {scenario:11s} run {i:2d}: "
                    + ", ".join(f"{k} {v * 1000:7.0f} ms" for k, v in run.items()),
                    flush=True,
                )
            row: dict[str, object] = {"nnodes": n, "scenario": scenario, "runs": args.runs}
            for key, values in samples.items():
                row[key] = common.summary(values, 1000)
            rp = statistics.median(samples["rallypoint_from_spawn"])
            row["kubeflow_over_rallypoint"] = round(statistics.median(samples["kubeflow"]) / rp, 2)
            row["sagemaker_over_rallypoint"] = round(
                statistics.median(samples["sagemaker"]) / rp, 2
            )
            table.append(row)

    print(
        f"\n{'N':>3} {'scenario':11s} {'rp spawn p50/p99 ms':>20} {'rp livez p50':>12} "
        f"{'kubeflow p50':>12} {'sagemaker p50':>13}"
    )
    for row in table:
        s, lv = row["rallypoint_from_spawn"], row["rallypoint_from_livez"]
        kf, sm = row["kubeflow"], row["sagemaker"]
        print(
            f"{row['nnodes']:3d} {row['scenario']:11s} {s['p50']:9.0f}/{s['p99']:<9.0f} "  # type: ignore[index]
            f"{lv['p50']:12.0f} {kf['p50']:12.0f} {sm['p50']:13.0f}"
        )  # type: ignore[index]
    targets = {
        f"n8_{row['scenario']}_{basis}_p50_ms": common.target(
            row[basis]["p50"],  # type: ignore[index]
            "<= 50",
            row[basis]["p50"] <= 50,  # type: ignore[index]
        )
        for row in table
        if row["nnodes"] == 8
        for basis in ("rallypoint_from_spawn", "rallypoint_from_livez")
    }
    common.print_targets(targets)
    common.write_run_summary(
        "time_to_ready",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs} --wait {args.wait:g}",
        {"table": table, "targets": targets},
    )
    if not args.no_plot:
        plot(table)


def plot(table: list[dict[str, object]]) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, scenario in zip(axes, ("master_last", "worker_last"), strict=True):
        rows = [r for r in table if r["scenario"] == scenario]
        xs = [r["nnodes"] for r in rows]
        for key, label in (
            ("rallypoint_from_spawn", "rallypoint (from spawn)"),
            ("rallypoint_from_livez", "rallypoint (from /livez)"),
            ("kubeflow", "Kubeflow-style loop"),
            ("sagemaker", "SageMaker-style backoff"),
        ):
            ax.plot(xs, [r[key]["p50"] for r in rows], "o-", label=label)  # type: ignore[index]
        ax.axhline(50, color="grey", ls="--", lw=1, label="target 50 ms")
        ax.minorticks_off()
        ax.set(
            xscale="log",
            yscale="log",
            xticks=xs,
            xticklabels=[str(x) for x in xs],
            xlabel="nodes",
            title=scenario.replace("_", " ") + " (p50)",
        )
    axes[0].set_ylabel("time to ready (ms)")
    axes[1].legend(fontsize=8)
    common.save_figure(fig, "time_to_ready")


if __name__ == "__main__":
    main()
