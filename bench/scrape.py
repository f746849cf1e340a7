"""Cost of a scrape, and series per node and cluster-wide, at N nodes (bench/simcluster.py).

One real master sidecar against N simulated workers, as bench/scale.py runs it (the fan-out
tree as the sidecars choose it), with a real relay (from 512 nodes) and a real worker (the
last member of that relay's group, or the last rank without a tree); once every node
verified, each real sidecar's GET /metrics is fetched ``--scrapes`` times on a fresh
connection each (as Prometheus does when its scrape interval outlasts the keep-alive):
bytes, series (sample lines), wall time per scrape (median, p99), and the series of every
per-peer family. Cluster-wide series are the master's plus each relay's and each worker's
as measured on the real ones (the simulated nodes export nothing). Measured twice:
``ready`` right after convergence, and ``down`` once the keep-alives (``--keepalive 1``)
named the simulated nodes down (they answer no keep-alive): the worst case on the master
and the relay, every peer down.

    python -m bench.scrape                      # N = 64, 1024, 4096
    python -m bench.scrape --sizes 64 --scrapes 5
"""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Any

from bench import common, simcluster
from rallypoint.core import fanout
from tests.support.cluster.nodes import Node

SIZES = (64, 1024, 4096)
#: Families with a label per peer: their series must stay bounded as N grows.
PER_PEER = (
    "rallypoint_peer_up",
    "rallypoint_link_throughput_bytes_per_second",
    "rallypoint_link_retransmit_ratio",
    "rallypoint_link_rtt_seconds",
)
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", re.M)


def measure(master: Node, scrapes: int) -> dict[str, Any]:
    """``scrapes`` fetches of the master's /metrics: size, series, time, per-peer series."""
    times, body = [], b""
    for _ in range(scrapes):
        t0 = time.perf_counter()
        reply = master.get("/metrics", timeout_s=30)
        times.append(time.perf_counter() - t0)
        assert reply.status == 200, reply.status
        body = reply.body
    names = Counter(_SAMPLE.findall(body.decode()))
    return {
        "bytes": len(body),
        "series": sum(names.values()),
        "scrape_ms": common.summary(times, 1000),
        "per_peer_series": {name: names.get(name, 0) for name in PER_PEER},
        "peers_down": _value(body, "rallypoint_peers_down"),
    }


def _value(body: bytes, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", body.decode(), re.M)
    return float(found.group(1)) if found else float("nan")


def after(scrapes: int, down_wait_s: float) -> Any:
    def run(nodes: dict[str, Node]) -> dict[str, Any]:
        master = nodes["master"]
        ready = {role: measure(node, scrapes) for role, node in nodes.items()}
        deadline = time.monotonic() + down_wait_s
        last, still = -1.0, 0
        while time.monotonic() < deadline and still < 3:  # the count stopped rising
            time.sleep(1.0)
            now = _value(master.get("/metrics", timeout_s=30).body, "rallypoint_peers_down")
            still = still + 1 if now == last and now > 0 else 0
            last = now
        return {"ready": ready, "down": {role: measure(n, scrapes) for role, n in nodes.items()}}

    return run


def main() -> None:
    p = common.parser(__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    p.add_argument("--scrapes", type=int, default=20)
    p.add_argument("--procs", type=int, default=2, help="simulator processes")
    p.add_argument("--down-wait", type=float, default=60.0, help="seconds to wait for 'down'")
    args = p.parse_args()
    reason = simcluster.prerequisites()
    if reason is not None:
        raise SystemExit(f"scrape benchmark needs network namespaces: {reason}")
    table, totals = [], []
    for n in args.sizes:
        r = simcluster.simulate(
            n, procs=args.procs, tree=True, master_args=("--keepalive", "1"),
            after=after(args.scrapes, args.down_wait), real_worker=True,
        )  # fmt: skip
        for phase in ("ready", "down"):
            for role, m in r.after[phase].items():
                row = {"workers": n, "phase": phase, "role": role, "complete": r.complete, **m}
                table.append(row)
                print(
                    f"N={n:5d} {phase:5s} {role:6s}: {m['bytes'] / 1024:7.1f} KiB, "
                    f"{m['series']:5d} series, scrape p50 {m['scrape_ms']['p50']:.1f} ms "
                    f"p99 {m['scrape_ms']['p99']:.1f} ms, peers down {m['peers_down']:g}, "
                    f"per-peer series {m['per_peer_series']}"
                )
        totals.append(cluster_wide(n + 1, r.relay_group, r.after["ready"]))
        print(f"N={n:5d} cluster-wide, healthy: {totals[-1]}")
    command = (
        f"python -m bench.scrape --sizes {' '.join(map(str, args.sizes))} --scrapes {args.scrapes}"
    )
    common.write_summary("scrape", {"command": command, "table": table, "cluster": totals})


#: Up to this many nodes every sidecar exported rallypoint_peer_up for every peer, before
#: the series were scoped to the nodes each one watches (the master all, a relay its group).
BEFORE_ALL_PEERS_UP_TO = 256


def cluster_wide(nnodes: int, group: int, ready: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A healthy cluster's series summed over its nodes: the master's, plus each relay's and
    each worker's as measured on the real ones; and rallypoint_peer_up's before the change
    (every node one per peer up to BEFORE_ALL_PEERS_UP_TO nodes, none above while healthy)."""
    relays = len(fanout.relays(group, nnodes))
    workers = nnodes - 1 - relays
    roles = {"master": 1, "relay": relays, "worker": workers}
    series = sum(ready[r]["series"] * k for r, k in roles.items() if r in ready)
    peer_up = sum(
        ready[r]["per_peer_series"]["rallypoint_peer_up"] * k
        for r, k in roles.items()
        if r in ready
    )
    before = nnodes * (nnodes - 1) if nnodes <= BEFORE_ALL_PEERS_UP_TO else 0
    return {
        "nodes": nnodes,
        "relays": relays,
        "series": series,
        "peer_up": peer_up,
        "peer_up_before": before,
        "per_node": {r: ready[r]["series"] for r in ready},
    }


if __name__ == "__main__":
    main()
