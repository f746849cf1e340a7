"""Value classes on the master's hot path: a join parsed, a 4096-member document encoded and
parsed, a report parsed, one member made, a verdict replaced; per call, A/B against a checkout.

Each round runs every operation in a fresh interpreter per checkout (this one and, with
--against, another one's src/ first on PYTHONPATH), the two interleaved and their order
swapped every round; a round's figure is the best of 3 timeit repeats, and the summary gives
the median and p99 over the rounds and the ratio of the medians.

    python -m bench.values --against ../old       # 15 rounds
    python -m bench.values --quick                # 3 rounds
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import common

NODES = 4096

# Runs in the child: only the public functions of wire/__init__.py and the value classes, so that it
# times any checkout whose classes are dataclasses or Structs alike.
CHILD = """
import dataclasses, json, sys, timeit
from rallypoint import wire
from rallypoint.wire import cluster
from rallypoint.model import ClusterDoc, Member
from rallypoint.reasons import Reason

nodes = int(sys.argv[1])
def member(rank):
    return Member(rank, f"node{rank:05d}", (f"10.{rank >> 8 & 255}.{rank & 255}.{rank % 7 + 1}",),
                  tf_port=2222, probe_port=40000 + rank % 1000)
doc = ClusterDoc("session-1", "g1", "node00000", 29500, tuple(member(r) for r in range(nodes)))
doc_body = cluster.encode_cluster_doc(doc)
join_body = wire.encode_join(wire.JoinRequest("session-1", member(7), "g0"))
report_body = wire.encode_report(wire.Report(
    "session-1", "g1", 7, "node00007", False,
    failures=(Reason("unreachable", "node00009 refused", host="node00009", ranks=(9,)),),
    net=wire.NetFacts("eth0", 1500, False)))
verdict = wire.Verdict("session-1", "g1", 3, False, (1, 2, 3), 3, (), 0, ())
if dataclasses.is_dataclass(verdict):
    replace = dataclasses.replace
else:
    import msgspec
    replace = msgspec.structs.replace
assert cluster.parse_cluster_doc(doc_body) == doc

ops = {
    "parse_join": (lambda: wire.parse_join(join_body), 2000),
    "parse_report": (lambda: wire.parse_report(report_body), 2000),
    "make_member": (lambda: Member(7, "node00007", ("10.0.7.1",), tf_port=2222), 20000),
    "replace_verdict": (lambda: replace(verdict, pending=(2, 3), pending_count=2), 20000),
    "encode_doc": (lambda: cluster.encode_cluster_doc(doc), 3),
    "parse_doc": (lambda: cluster.parse_cluster_doc(doc_body), 3),
}
out = {}
for name, (call, number) in ops.items():
    out[name] = min(timeit.repeat(call, number=number, repeat=3)) / number
print(json.dumps(out))
"""


def run_child(src: Path, nodes: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(nodes)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    args = common.ab_parser(__doc__, rounds=15).parse_args()
    rounds = 3 if args.quick else args.rounds
    variants = common.checkouts(args.against)
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    load = [os.getloadavg()[0]]
    for i in range(rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            for op, seconds in run_child(variants[name], NODES).items():
                samples[name].setdefault(op, []).append(seconds)
        print(f"round {i + 1}/{rounds} done", flush=True)
    load.append(os.getloadavg()[0])

    report: dict[str, object] = {}
    for op in samples["this"]:
        entry: dict[str, object] = {
            name: common.summary(samples[name][op], 1e6) for name in variants
        }
        p50 = {name: common.percentile(samples[name][op], 50) * 1e6 for name in variants}
        line = f"{op:16s} this p50 {p50['this']:10.2f} us"
        if "against" in variants:
            ratio = p50["this"] / p50["against"]
            entry["ratio_p50"] = round(ratio, 3)
            line += f"  against p50 {p50['against']:10.2f} us  ratio {ratio:.2f}"
        report[op] = entry
        print(line)
    common.write_run_summary(
        "values",
        args,
        f"--rounds {rounds}" + (" --against CHECKOUT" if args.against else ""),
        {
            "nodes": NODES,
            "rounds": rounds,
            "unit": "us per call",
            "load_avg_1m": [round(x, 1) for x in load],
            "against": str(args.against) if args.against else None,
            "ops": report,
        },
    )


if __name__ == "__main__":
    main()
