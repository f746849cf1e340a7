"""Per-tier test times from a pytest JUnit report: the table in docs/testing.md.

    bash scripts/test.sh --junitxml=report.xml
    python scripts/tier_times.py report.xml

A test's time is its setup, call and teardown (pytest's junit_duration_report "total"). With
the tests side by side, a tier's summed time is the work it gives the workers, not the wall
clock: the run's own time is pytest's last line.
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def tier_of(classname: str) -> str:
    """``tests.multihost.test_run`` -> ``multihost``."""
    parts = classname.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "other"


def without_group(name: str) -> str:
    """A test's name without the ``@group`` xdist adds under --dist loadgroup."""
    at = name.rfind("@")
    return name[:at] if at > name.rfind("]") else name


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("report", type=Path, help="the --junitxml file of one run")
    args = p.parse_args()
    try:
        root = ET.parse(args.report).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"tier_times: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    seconds: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.Counter()
    longest: dict[str, tuple[float, str]] = {}
    for case in root.iter("testcase"):
        tier = tier_of(case.get("classname", ""))
        took = float(case.get("time", "0") or 0)
        seconds[tier] += took
        counts[tier] += 1
        if took > longest.get(tier, (-1.0, ""))[0]:
            longest[tier] = (took, without_group(case.get("name", "")))
    print("| tier | tests | summed time (s) | longest test (s) |")
    print("|---|---|---|---|")
    for tier in sorted(seconds, key=seconds.__getitem__, reverse=True):
        took, name = longest[tier]
        print(f"| {tier} | {counts[tier]} | {seconds[tier]:.0f} | {took:.0f} (`{name}`) |")
    print(f"| all | {sum(counts.values())} | {sum(seconds.values()):.0f} | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
