"""What the data-path checks move, by arithmetic: bytes per node and on the wire, N = 8 ... 4096.

Pure arithmetic from the code's own choices, nothing started: each node probes the peers
of ``names.scope_ranks(N, rank, "auto")`` (its own rank aside) on their probe port, and each
probe moves ``Settings().throughput_bytes`` each way to the peers of
``links.measured_peers(N, rank)``, ``prober.MEASURES`` times (a measured link repeats
its transfer while the ones so far were quick, as they are on the fast links modelled
here), and ``datapath.PATH_BYTES`` each way to the others; with
``--no-throughput`` every probe moves PATH_BYTES. A node sends the up legs of its own
probes and the down legs of the probes it answers (and receives as much).

The time per node is a floor on a full-duplex link at 10 and 100 Gbit/s: the node's larger
direction (sent or received) at the line rate, plus ``ROUND_TRIPS`` round trips of
``RTT_S`` (a LAN's 50 us) per wave of ``Settings().probe_workers`` concurrent probes
(connect, challenge, up leg acknowledged, down leg and its RPSTAT/1). TCP slow start, CPU,
the legs of the other nodes sharing a switch and the path-MTU search (only after a stall)
are left out.

With bench/results/datapath_cost.json present (checks_cost.py), the bytes its runs read
from every node's ``rallypoint_probe_bytes_total`` at N = 8 and 16 sit beside the model's.

    python -m bench.datapath_model
"""

from __future__ import annotations

import json
import math
import statistics

from bench import common
from rallypoint.core import links, names
from rallypoint.net import datapath
from rallypoint.rendezvous.checks import prober
from rallypoint.settings import Settings

SIZES = (8, 16, 64, 1024, 4096)
RATES_GBPS = (10, 100)
RTT_S = 50e-6
#: Round trips of one probe that carry no bulk data: TCP connect, challenge and answer,
#: the up leg's ACK line, the RPSTAT/1 question and answer.
ROUND_TRIPS = 4
SEED = "model-session"


def per_node(nnodes: int, throughput: bool) -> dict[str, list[int]]:
    """Each rank's probes made and answered, links measured, bytes sent and received."""
    settings = Settings()
    big = settings.throughput_bytes * prober.MEASURES if throughput else datapath.PATH_BYTES
    probes_out = [0] * nnodes
    probes_in = [0] * nnodes
    link_ends = [0] * nnodes
    sent = [0] * nnodes
    received = [0] * nnodes
    for rank in range(nnodes):
        measured = set(links.measured_peers(nnodes, rank)) if throughput else set()
        for peer in names.scope_ranks(nnodes, rank, "auto", seed=SEED):
            if peer == rank:
                continue
            size = big if peer in measured else datapath.PATH_BYTES
            probes_out[rank] += 1
            probes_in[peer] += 1
            # Up leg: rank -> peer; down leg: peer -> rank, size bytes each.
            sent[rank] += size
            received[peer] += size
            sent[peer] += size
            received[rank] += size
        for peer in measured:
            link_ends[rank] += 1
            link_ends[peer] += 1
    return {
        "probes_made": probes_out,
        "probes_answered": probes_in,
        "measured_links": link_ends,
        "sent": sent,
        "received": received,
    }


def model(nnodes: int, throughput: bool) -> dict[str, object]:
    settings = Settings()
    nodes = per_node(nnodes, throughput)
    sent, received = nodes["sent"], nodes["received"]
    waves = [
        math.ceil(max(a, b) / settings.probe_workers)
        for a, b in zip(nodes["probes_made"], nodes["probes_answered"], strict=True)
    ]
    heaviest = max(range(nnodes), key=lambda r: max(sent[r], received[r]))
    out: dict[str, object] = {
        "nnodes": nnodes,
        "throughput": throughput,
        "probes_made_per_node": _mean_max(nodes["probes_made"]),
        "probes_answered_per_node": _mean_max(nodes["probes_answered"]),
        "measured_links_per_node": _mean_max(nodes["measured_links"]),
        "sent_bytes_per_node": _mean_max(sent),
        "heaviest_rank": heaviest,
        "cluster_bytes": sum(sent),
    }
    for gbps in RATES_GBPS:
        rate = gbps * 1e9 / 8
        times = [
            max(s, r) / rate + w * ROUND_TRIPS * RTT_S
            for s, r, w in zip(sent, received, waves, strict=True)
        ]
        out[f"time_ms_at_{gbps}g"] = {
            "mean": round(statistics.fmean(times) * 1000, 3),
            "max": round(max(times) * 1000, 3),
        }
    return out


def _mean_max(values: list[int]) -> dict[str, float]:
    return {"mean": round(statistics.fmean(values), 2), "max": max(values)}


def measured(path_name: str = "datapath_cost") -> list[dict[str, object]]:
    """Bytes sent per node as checks_cost.py read them, beside the model, per N and variant."""
    path = common.RESULTS_DIR / f"{path_name}.json"
    if not path.exists():
        return []
    out = []
    for row in json.loads(path.read_text())["table"]:
        for variant, throughput in (("data", True), ("no_throughput", False)):
            mean = row.get(f"{variant}_sent_mean_bytes_p50")
            if mean is None:
                continue
            want = model(int(row["nnodes"]), throughput)["sent_bytes_per_node"]
            out.append(
                {
                    "nnodes": row["nnodes"],
                    "scenario": row["scenario"],
                    "variant": variant,
                    "measured_sent_mean_bytes_p50": mean,
                    "measured_sent_max_bytes_p50": row.get(f"{variant}_sent_max_bytes_p50"),
                    "model_sent_mean_bytes": want["mean"],  # type: ignore[index]
                    "measured_over_model": round(float(mean) / want["mean"], 4),  # type: ignore[index]
                }
            )
    return out


def main() -> None:
    p = common.parser(__doc__)
    p.parse_args()
    table = [model(n, t) for n in SIZES for t in (True, False)]
    print(
        f"{'N':>5} {'tput':>4} {'probes/node':>11} {'answered max':>12} {'links/node':>10} "
        f"{'sent/node MiB mean/max':>22} {'cluster GiB':>11} "
        f"{'10G ms mean/max':>16} {'100G ms mean/max':>17}"
    )
    mib = 1024 * 1024
    for row in table:
        made, answered = row["probes_made_per_node"], row["probes_answered_per_node"]
        ends, sent = row["measured_links_per_node"], row["sent_bytes_per_node"]
        t10, t100 = row["time_ms_at_10g"], row["time_ms_at_100g"]
        print(
            f"{row['nnodes']:5d} {'on' if row['throughput'] else 'off':>4} "  # type: ignore[index]
            f"{made['mean']:11.1f} {answered['max']:12d} {ends['mean']:10.1f} "  # type: ignore[index]
            f"{sent['mean'] / mib:11.2f}/{sent['max'] / mib:<10.2f} "  # type: ignore[index]
            f"{row['cluster_bytes'] / mib / 1024:11.3f} "  # type: ignore[operator]
            f"{t10['mean']:8.2f}/{t10['max']:<7.2f} {t100['mean']:8.2f}/{t100['max']:<8.2f}"  # type: ignore[index]
        )
    checks = measured()
    if checks:
        print("\nmeasured (checks_cost.py, /metrics) against the model, bytes sent per node:")
        for c in checks:
            print(
                f"N={c['nnodes']:2d} {c['scenario']:11s} {c['variant']:13s} "
                f"measured {c['measured_sent_mean_bytes_p50']:>10.0f} "
                f"model {c['model_sent_mean_bytes']:>10.0f} "
                f"ratio {c['measured_over_model']}"
            )
    common.write_summary(
        "datapath_model",
        {
            "command": "python -m bench.datapath_model",
            "assumptions": {
                "path_bytes": datapath.PATH_BYTES,
                "throughput_bytes": Settings().throughput_bytes,
                "transfers_per_measured_link": prober.MEASURES,
                "probe_workers": Settings().probe_workers,
                "rtt_s": RTT_S,
                "round_trips_per_probe": ROUND_TRIPS,
                "link": "full duplex, the node's larger direction at line rate",
                "left_out": "TCP slow start, CPU, switch contention, path-MTU search",
                "resolve_scope": "auto",
                "seed": SEED,
            },
            "table": table,
            "measured": checks,
        },
    )


if __name__ == "__main__":
    main()
