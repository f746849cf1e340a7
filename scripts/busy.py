"""Run a command and print how busy it kept the whole machine: wall time, CPU-seconds, share.

    python scripts/busy.py -- python -m pytest -n 4 --dist loadgroup

The CPU-seconds are the machine's, from /proc/stat (user, nice, system, irq, softirq and
steal; not idle or iowait), so they count every process a test starts: sidecars in network
namespaces, Docker containers, slurmd's job steps. Run it on an otherwise quiet machine.
Exits with the command's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system (idle iowait) irq softirq steal


def busy_seconds() -> float:
    """CPU-seconds every core has spent busy since boot."""
    with open("/proc/stat") as stat:
        fields = stat.readline().split()[1:]
    return sum(int(fields[i]) for i in BUSY_FIELDS) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    argv = sys.argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python scripts/busy.py -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    cores = os.cpu_count() or 1
    busy0, wall0 = busy_seconds(), time.monotonic()
    status = subprocess.call(argv)
    busy, wall = busy_seconds() - busy0, time.monotonic() - wall0
    print(
        f"busy.py: {wall:.0f} s wall, {busy:.0f} CPU-seconds busy,"
        f" {busy / wall / cores:.0%} of {cores} cores",
        file=sys.stderr,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
