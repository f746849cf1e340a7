"""rallypoint's master against torch's TCPStore, side by side, at the same N.

Both exchanges run in the same two network namespaces (bench/simcluster.py): the server in
``main1`` pinned to CPU 0, the simulated workers in ``sim1`` pinned to CPU 1, split over
processes, all starting at one instant. The two are interleaved run by run.

* rallypoint: the real master (`rallypoint serve`) and bench/simpeers.py: each worker
  joins, long-polls the cluster document, reports its checks as passed and long-polls the
  verdict until verified (simcluster.simulate), with the fan-out tree as the sidecars run
  by default from 512 nodes (docs/scale.md; a real relay serves one group). Server CPU is
  the master's; each relay spends its own on its own node (bench/scale.py reports the real
  relay's).
* TCPStore: torch's own server (``TCPStore(is_master=True)``, libuv backend, the default)
  in a process that publishes rank 0's facts, and torch's own client: every simulated
  worker is a thread with its own ``TCPStore`` client connection that sets
  ``facts/<rank>`` to the same JSON member record a join carries, waits for every rank's
  key and fetches them all with one ``multi_get``: a store-based all-gather of the facts,
  the way a store-based rendezvous exchanges them. No checks, no verdict, no signatures:
  this is the floor a store gives for the exchange alone.

Convergence runs from the common start until the last worker holds everyone's facts
(TCPStore) or a verified verdict (rallypoint; its "last document" time, the step that
matches the store's exchange, is shown beside it). Server CPU is utime + stime of the
server process over the run, peak memory its VmHWM (and its growth over the RSS it had
before the run: the TCPStore server process imports torch). Every run checks that each worker got
complete, identical facts (rallypoint: one document digest listing every node; TCPStore:
every worker's list equal to one reference list holding N + 1 valid records).

    python -m bench.tcpstore_compare                      # N = 1024, 4096, 3 runs each
    python -m bench.tcpstore_compare --sizes 16384 --runs 1
    python -m bench.tcpstore_compare --quick              # N = 256, one run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from typing import Any

from bench import common, simcluster
from tests.support.cluster.build import Cluster
from tests.support.netns import wait_for

STORE_PORT = 29400
#: resolv.conf for the store's namespaces: nothing listens there, so every query fails at once.
NO_DNS = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
SIZES = (1024, 4096)


def facts(rank: int, address: str) -> bytes:
    """The record one node publishes: the body of its rallypoint join (the same JSON)."""
    from rallypoint import wire
    from rallypoint.model import Member

    host = f"w{rank}" if rank else "main1"
    member = Member(rank=rank, host=host, addresses=(address,), tf_port=2222)
    return wire.encode_join(wire.JoinRequest("bench", member))


# -- the two roles, run inside the namespaces --------------------------------------------------


def serve_store(args: argparse.Namespace) -> None:
    """The TCPStore server; publishes rank 0's facts, then runs until killed."""
    from datetime import timedelta

    import torch.distributed as dist

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    store = dist.TCPStore(
        args.host,
        args.port,
        world_size=None,
        is_master=True,
        timeout=timedelta(seconds=args.timeout),
        wait_for_workers=False,
    )
    store.set("facts/0", facts(0, args.host))
    print("serving", flush=True)
    while True:
        time.sleep(3600)


def store_clients(args: argparse.Namespace) -> None:
    """Ranks first..first+count-1 as threads, each with its own TCPStore client."""
    from datetime import timedelta

    import torch.distributed as dist

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    threading.stack_size(256 * 1024)
    keys = [f"facts/{r}" for r in range(args.nnodes)]
    go = threading.Event()
    lock = threading.Lock()
    done_at: list[float] = []
    errors: list[str] = []
    reference: list[list[bytes]] = []
    mismatches = [0]
    phases: dict[str, list[float]] = {"connect": [], "set": [], "wait": [], "multi_get": []}

    def one(rank: int) -> None:
        go.wait()
        try:
            t0 = time.monotonic()
            store = dist.TCPStore(
                args.host,
                args.port,
                is_master=False,
                timeout=timedelta(seconds=args.timeout),
                wait_for_workers=False,
            )
            t1 = time.monotonic()
            store.set(keys[rank], facts(rank, args.address))
            t2 = time.monotonic()
            store.wait(keys)
            t3 = time.monotonic()
            values = store.multi_get(keys)
            at = time.monotonic()
            with lock:
                for name, took in zip(phases, (t1 - t0, t2 - t1, t3 - t2, at - t3), strict=True):
                    phases[name].append(took)
        except Exception as exc:  # counted and reported, the run goes on
            with lock:
                errors.append(type(exc).__name__)
            return
        with lock:
            done_at.append(at)
            if not reference:
                reference.append(values)
            elif values != reference[0]:
                mismatches[0] += 1

    threads = [
        threading.Thread(target=one, args=(r,), daemon=True)
        for r in range(args.first, args.first + args.count)
    ]
    for t in threads:
        t.start()
    time.sleep(max(0.0, args.start_at - time.monotonic()))
    start = time.monotonic()
    cpu0 = time.process_time()
    go.set()
    for t in threads:
        t.join()
    cpu = time.process_time() - cpu0
    complete = False
    if reference:
        records = [json.loads(v) for v in reference[0]]
        complete = len(records) == args.nnodes and all(
            rec["rank"] == r for r, rec in enumerate(records)
        )
    print(
        json.dumps(
            {
                "start": start,
                "count": args.count,
                "done_at": done_at,
                "errors": errors,
                "mismatches": mismatches[0],
                "complete": complete,
                "facts_bytes": sum(len(v) for v in reference[0]) if reference else 0,
                "phase_s": {k: common.summary(v) for k, v in phases.items()},
                "sim_cpu_s": round(cpu, 3),
            }
        ),
        flush=True,
    )


# -- one TCPStore run --------------------------------------------------------------------------


def store_run(workers: int, procs: int, timeout_s: float) -> dict[str, Any]:
    me = [sys.executable, "-m", "bench.tcpstore_compare"]  # its children share this cwd
    with (
        common.workdir("rp-store-") as workdir,
        Cluster(
            ("main1", "sim1"), workdir, session=f"store-{os.getpid()}", sidecar_args=()
        ) as cluster,
    ):
        master, sim = cluster["main1"], cluster["sim1"]
        for node in (master, sim):
            # torch's client and server reverse-resolve every peer address (for their log
            # lines); with no DNS server reachable from the namespaces each lookup waits
            # out the resolver's timeout (10 s per connection). A resolver that refuses at
            # once keeps that out of the figures: the store is measured, not the lookup.
            (node.hosts_path.parent / "resolv.conf").write_text(NO_DNS)
        server = master.spawn(
            [
                *me, "server",
                "--host", master.address, "--port", str(STORE_PORT),
                "--timeout", str(timeout_s),
            ],
            label="tcpstore",
        )  # fmt: skip
        os.sched_setaffinity(server.pid, {0})
        wait_for(lambda: "serving" in server.log(), timeout_s=30, interval_s=0.02, what="TCPStore")
        time.sleep(0.5)
        cpu0 = common.cpu_seconds(server.pid)
        rss0 = common.memory_kib(server.pid)["VmRSS"] / 1024
        start_at = time.monotonic() + 1.5 + 0.0004 * workers  # every thread started by then
        runners = []
        for first, count in simcluster.split(workers, procs):
            runner = sim.spawn(
                [
                    *me, "clients",
                    "--host", master.address, "--port", str(STORE_PORT),
                    "--nnodes", str(workers + 1), "--first", str(first), "--count", str(count),
                    "--address", sim.address, "--start-at", repr(start_at),
                    "--timeout", str(timeout_s),
                ],
                label="storeclients",
            )  # fmt: skip
            os.sched_setaffinity(runner.pid, {1})
            runners.append(runner)
        deadline = time.monotonic() + timeout_s + 30
        while any(r.alive() for r in runners) and time.monotonic() < deadline:
            time.sleep(0.02)
        cpu1 = common.cpu_seconds(server.pid)
        mem = common.memory_kib(server.pid)
        for r in runners:
            if r.alive():
                r.kill()  # past the deadline: its ranks count as failed
        parts = [
            json.loads(next(t for t in reversed(r.log().splitlines()) if t.startswith("{")))
            for r in runners
            if any(t.startswith("{") for t in r.log().splitlines())
        ]
        if not parts:
            # Not one client process finished within the deadline: a failed run, with what
            # the server had spent and held by then.
            return {
                "converge_s": float("nan"),
                "done": 0,
                "complete_identical": False,
                "server_cpu_s": cpu1 - cpu0,
                "server_hwm_mb": mem["VmHWM"] / 1024,
                "server_rss_before_mb": rss0,
                "sim_cpu_s": float("nan"),
                "facts_kib": float("nan"),
                "errors": [f"no client process finished within {timeout_s:g} s"],
                "phase_s": {},
                "start_skew_s": float("nan"),
            }
    start = min(p["start"] for p in parts)
    done = [t - start for p in parts for t in p["done_at"]]
    ok = len(done) == workers and all(p["complete"] and not p["mismatches"] for p in parts)
    return {
        "converge_s": max(done) if ok else float("nan"),
        "done": len(done),
        "complete_identical": ok,
        "server_cpu_s": cpu1 - cpu0,
        "server_hwm_mb": mem["VmHWM"] / 1024,
        "server_rss_before_mb": rss0,
        "sim_cpu_s": round(sum(p["sim_cpu_s"] for p in parts), 2),
        "facts_kib": round(max(p["facts_bytes"] for p in parts) / 1024, 1),
        "errors": [e for p in parts for e in p["errors"]][:5],
        "phase_s": parts[0]["phase_s"],
        "start_skew_s": max(p["start"] for p in parts) - start,
    }


def rallypoint_run(workers: int, procs: int, timeout_s: float) -> dict[str, Any]:
    # As the sidecars run by default: from 512 nodes, the fan-out tree (docs/scale.md).
    r = simcluster.simulate(workers, procs=procs, timeout_s=timeout_s, tree=True)
    s = r.sim
    return {
        "converge_s": r.converge_s,
        "last_doc_s": r.last_doc_s,
        "relay_group": r.relay_group,
        "done": s["verified_ok"] + (r.real_relay_ready_s is not None),
        "complete_identical": r.complete,
        "server_cpu_s": r.master_cpu_s,
        "server_hwm_mb": r.master_hwm_mb,
        "server_rss_before_mb": r.master_rss_before_mb,
        "sim_cpu_s": s["sim_cpu_s"],
        "doc_kib": round(s["doc_bytes"] / 1024, 1),
        "errors": s["errors"],
    }


def main() -> None:
    p = common.parser(__doc__)
    sub = p.add_subparsers(dest="role")
    srv = sub.add_parser("server")
    cli = sub.add_parser("clients")
    for q in (srv, cli):
        q.add_argument("--host", required=True)
        q.add_argument("--port", type=int, required=True)
        q.add_argument("--timeout", type=float, default=120.0)
    cli.add_argument("--nnodes", type=int, required=True)
    cli.add_argument("--first", type=int, required=True)
    cli.add_argument("--count", type=int, required=True)
    cli.add_argument("--address", required=True)
    cli.add_argument("--start-at", type=float, required=True)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--big-runs", type=int, default=None, help="runs for N >= 4096")
    p.add_argument("--procs", type=int, default=2, help="simulator processes for each side")
    p.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    if args.role == "server":
        serve_store(args)
        return
    if args.role == "clients":
        store_clients(args)
        return
    common.can_plot(p, args)
    if args.quick:
        args.sizes, args.runs = [256], 1
    reason = simcluster.prerequisites()
    if reason is not None:
        raise SystemExit(f"this benchmark needs network namespaces: {reason}")

    table = []
    for n in args.sizes:
        rp_runs, st_runs = [], []
        runs = args.big_runs if args.big_runs is not None and n >= 4096 else args.runs
        for i in range(runs):
            # Interleaved, the order alternating, so both see the same machine load.
            order = ("rallypoint", "tcpstore") if i % 2 == 0 else ("tcpstore", "rallypoint")
            for side in order:
                if side == "rallypoint":
                    rp_runs.append(rallypoint_run(n, args.procs, args.timeout))
                    r = rp_runs[-1]
                else:
                    st_runs.append(store_run(n, args.procs, args.timeout))
                    r = st_runs[-1]
                print(
                    f"N={n:5d} run {i} {side:10s}: converged {r['converge_s']:.3f} s "
                    f"({r['done']}/{n} complete and identical: {r['complete_identical']}), "
                    f"server CPU {r['server_cpu_s']:.2f} s, VmHWM {r['server_hwm_mb']:.1f} MB "
                    f"(RSS before {r['server_rss_before_mb']:.1f} MB), "
                    f"simulator CPU {r['sim_cpu_s']:.2f} s, errors {r['errors']}",
                    flush=True,
                )

        row = {
            "workers": n,
            "runs": runs,
            "rallypoint": {
                **_side(rp_runs),
                "last_doc_s_p50": _median(rp_runs, "last_doc_s"),
            },
            "tcpstore": {
                **_side(st_runs),
                "facts_kib": st_runs[0]["facts_kib"],
                "phase_s_last_run": st_runs[-1]["phase_s"],
            },
        }
        rp, st = row["rallypoint"], row["tcpstore"]
        # Ratios of medians from the same interleaved runs: above 1, rallypoint costs more.
        row["ratio_rallypoint_over_tcpstore"] = {
            "converge": round(rp["converge_s_p50"] / st["converge_s_p50"], 2),
            "converge_last_doc": round(rp["last_doc_s_p50"] / st["converge_s_p50"], 2),
            "server_cpu": round(rp["server_cpu_s_p50"] / max(st["server_cpu_s_p50"], 0.01), 2),
            "server_hwm": round(rp["server_hwm_mb_max"] / st["server_hwm_mb_max"], 2),
            "server_growth": round(
                rp["server_growth_mb_max"] / max(st["server_growth_mb_max"], 0.1), 2
            ),
        }
        table.append(row)

    print(
        f"\n{'N':>6} {'side':>10} {'converge s':>10} {'server CPU s':>12} {'VmHWM MB':>9} "
        f"{'sim CPU s':>9} {'failures':>8}"
    )
    for row in table:
        for side in ("rallypoint", "tcpstore"):
            r = row[side]
            print(
                f"{row['workers']:6d} {side:>10} {r['converge_s_p50']:10.3f} "
                f"{r['server_cpu_s_p50']:12.2f} {r['server_hwm_mb_max']:9.1f} "
                f"{r['sim_cpu_s_p50']:9.2f} {r['failures']:8d}"
            )
        print(f"{'':6} {'ratio':>10} {row['ratio_rallypoint_over_tcpstore']}")
    common.write_run_summary(
        "tcpstore_compare",
        args,
        f"--sizes {' '.join(map(str, args.sizes))} --runs {args.runs}"
        f"{'' if args.big_runs is None else f' --big-runs {args.big_runs}'}"
        f" --procs {args.procs} --timeout {args.timeout:g}",
        {"load": os.getloadavg(), "table": table},
    )
    if not args.no_plot:
        plot(table)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return round(statistics.median(r[key] for r in runs), 3)


def _side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures both sides report, over one size's runs."""
    return {
        "converge_s_p50": _median(runs, "converge_s"),
        "server_cpu_s_p50": _median(runs, "server_cpu_s"),
        "server_hwm_mb_max": round(max(r["server_hwm_mb"] for r in runs), 1),
        "server_growth_mb_max": round(
            max(r["server_hwm_mb"] - r["server_rss_before_mb"] for r in runs), 1
        ),
        "sim_cpu_s_p50": _median(runs, "sim_cpu_s"),
        "failures": sum(not r["complete_identical"] for r in runs),
    }


def plot(table: list[dict[str, Any]]) -> None:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    xs = [row["workers"] for row in table]
    for ax, key, label in (
        (axes[0], "converge_s_p50", "convergence (s, p50)"),
        (axes[1], "server_cpu_s_p50", "server CPU (s, p50)"),
        (axes[2], "server_hwm_mb_max", "server VmHWM (MB)"),
    ):
        for side, style in (("rallypoint", "o-"), ("tcpstore", "s--")):
            ax.plot(xs, [row[side][key] for row in table], style, label=side)
        ax.set(xscale="log", xlabel="simulated workers", ylabel=label)
        ax.legend()
    fig.suptitle("rallypoint master vs torch TCPStore, same runs")
    common.save_figure(fig, "tcpstore_compare")


if __name__ == "__main__":
    main()
