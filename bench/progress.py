"""What marking progress costs a training step (docs/run.md "Hangs: progress and stalls").

A job marks RALLYPOINT_PROGRESS_FILE once or twice per step. This times each way a job may
mark, many times in a row, on a file where `rallypoint run` puts it (/dev/shm when it can,
cli/errorfile.scratch_dir) and, beside it, in the temporary directory (a disk), and prints
the median and the 99th percentile per mark in microseconds:

* write: open the file, write "STEP PHASE", close it (what tests/support/steps.py does);
* pwrite: one ``os.pwrite`` of a fixed-width line at offset 0 on a descriptor kept open;
* utime: ``os.utime(path)`` on a file that exists (a touch);
* read: what `run` does every 0.25 s on its side (open without following, fstat, read).

    python -m bench.progress                 # 20,000 marks of each kind
    python -m bench.progress --marks 100000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from rallypoint.cli import errorfile, progressfile


def timed(mark: Callable[[int], object], count: int) -> dict[str, float]:
    samples = []
    for step in range(count):
        began = time.perf_counter_ns()
        mark(step)
        samples.append((time.perf_counter_ns() - began) / 1000)
    samples.sort()
    return {
        "median_us": round(statistics.median(samples), 2),
        "p99_us": round(samples[int(len(samples) * 0.99)], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--marks", type=int, default=20_000)
    args = parser.parse_args()
    results = {}
    for where, base in (("run's directory", errorfile.scratch_dir()), ("temporary", None)):
        with tempfile.TemporaryDirectory(prefix="rallypoint-run-", dir=base) as folder:
            path = os.path.join(folder, "progress-attempt-0")

            def write(step: int, path: str = path) -> None:
                with open(path, "w") as marking:
                    marking.write(f"{step} collective")

            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                results[f"{where} ({folder.rsplit('/', 1)[0]})"] = {
                    "write": timed(write, args.marks),
                    "pwrite": timed(
                        lambda step, fd=fd: os.pwrite(
                            fd, f"{step:>12} {'collective':<16}\n".encode(), 0
                        ),
                        args.marks,
                    ),
                    "utime": timed(lambda _, path=path: os.utime(path), args.marks),
                    "read": timed(lambda _, path=path: progressfile.read(path), args.marks),
                }
            finally:
                os.close(fd)
    print(json.dumps({"marks": args.marks, "per_mark": results}, indent=2))


if __name__ == "__main__":
    main()
