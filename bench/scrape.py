"""Cost of a scrape: the master's /metrics at N simulated workers (bench/simcluster.py).

One real master sidecar against N simulated workers, as bench/scale.py runs it (the fan-out
tree as the sidecars choose it); once every worker verified, the master's GET /metrics is
fetched ``--scrapes`` times on a fresh connection each (as Prometheus does when its scrape
interval outlasts the keep-alive): bytes, series (sample lines), wall time per scrape
(median, p99), and the series of every per-peer family. Measured twice: ``ready`` right
after convergence, and ``down`` once the master's keep-alives (``--keepalive 1``) named the
simulated workers down (they answer no keep-alive): the worst case, every peer down.

    python bench/scrape.py                      # N = 64, 1024, 4096
    python bench/scrape.py --sizes 64 --scrapes 5
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from typing import Any

import common
import simcluster

sys.path.insert(0, str(common.REPO))
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
    def run(master: Node) -> dict[str, Any]:
        ready = measure(master, scrapes)
        deadline = time.monotonic() + down_wait_s
        last, still = -1.0, 0
        while time.monotonic() < deadline and still < 3:  # the count stopped rising
            time.sleep(1.0)
            now = _value(master.get("/metrics", timeout_s=30).body, "rallypoint_peers_down")
            still = still + 1 if now == last and now > 0 else 0
            last = now
        return {"ready": ready, "down": measure(master, scrapes)}

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
    table = []
    for n in args.sizes:
        r = simcluster.simulate(
            n, procs=args.procs, tree=True, master_args=("--keepalive", "1"),
            after=after(args.scrapes, args.down_wait),
        )  # fmt: skip
        for phase in ("ready", "down"):
            m = r.after[phase]
            row = {"workers": n, "phase": phase, "complete": r.complete, **m}
            table.append(row)
            print(
                f"N={n:5d} {phase:5s}: {m['bytes'] / 1024:7.1f} KiB, {m['series']:5d} series, "
                f"scrape p50 {m['scrape_ms']['p50']:.1f} ms p99 {m['scrape_ms']['p99']:.1f} ms, "
                f"peers down {m['peers_down']:g}, per-peer series {m['per_peer_series']}"
            )
    command = (
        f"python bench/scrape.py --sizes {' '.join(map(str, args.sizes))} --scrapes {args.scrapes}"
    )
    common.write_summary("scrape", {"command": command, "table": table})


if __name__ == "__main__":
    main()
