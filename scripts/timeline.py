"""Where a side-by-side test run's time went, from the timeline tests/conftest.py writes.

    RALLYPOINT_TEST_TIMELINE=/tmp/timeline.jsonl bash scripts/test.sh
    python3 scripts/timeline.py /tmp/timeline.jsonl

Prints each worker's busy seconds, each tier's seconds, the modules that used the most CPU
(the worker and the children it reaped: sidecars, frameworks; not containers or Slurm
steps), the longest tests, and what ran in the last minutes (a long test started late
leaves the other workers idle at the end).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    with open(path) as lines:
        runs = [json.loads(line) for line in lines if line.strip()]
    if not runs:
        print(f"{path}: no tests recorded")
        return 1
    begin, end = min(r["start"] for r in runs), max(r["end"] for r in runs)
    print(f"{len(runs)} tests over {end - begin:.0f} s")
    workers: dict[str, float] = defaultdict(float)
    tiers: dict[str, float] = defaultdict(float)
    for r in runs:
        took = r["end"] - r["start"]
        workers[r["worker"]] += took
        parts = r["test"].split("/")
        tiers[parts[1] if len(parts) > 2 else "-"] += took
    for worker, busy in sorted(workers.items()):
        print(f"  worker {worker}: busy {busy:.0f} s of {end - begin:.0f}")
    print("by tier: " + ", ".join(f"{t} {s:.0f} s" for t, s in sorted(tiers.items())))
    if all("cpu_s" in r for r in runs):
        files: dict[str, float] = defaultdict(float)
        for r in runs:
            files[r["test"].split("::")[0]] += r["cpu_s"]
        total = sum(r["cpu_s"] for r in runs)
        print(f"CPU seconds the workers and their reaped children used: {total:.0f}; most:")
        for name, cpu in sorted(files.items(), key=lambda x: -x[1])[:15]:
            print(f"  {cpu:6.0f} s  {name}")
    print("longest:")
    for r in sorted(runs, key=lambda r: r["start"] - r["end"])[:15]:
        print(f"  {r['end'] - r['start']:6.1f} s  from {r['start'] - begin:5.0f} s  {r['test']}")
    print("still running in the last 120 s:")
    for r in sorted((r for r in runs if r["end"] > end - 120), key=lambda r: r["start"]):
        print(f"  {r['start'] - begin:5.0f}-{r['end'] - begin:5.0f} s  {r['worker']}  {r['test']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
