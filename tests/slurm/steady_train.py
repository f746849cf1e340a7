"""A training job that runs until it is stopped: gloo all-reduces of 4 MiB, step after step.

Run by torchrun (it reads torchrun's env). Each step all-reduces ``--mib`` MiB of float32
and checks every element; a short pause between steps keeps three nodes of it from taking a
shared two-core machine. After the first step each process prints ``RUNNING rank=R`` (the
job is past gloo's full mesh: killing a node now kills it mid-job). It gives up with exit 3
after ``--limit`` seconds, so a job that nothing stops still ends by itself.

For the restart test, two variables reach it through the batch script, srun, `rallypoint
run` and torchrun: ``STEADY_STEPS`` ends the job (exit 0, ``DONE rank=R``) after that many
steps, and ``STEADY_CRASH_RANK`` makes that rank exit 3 after its first step in attempt 0
(``RALLYPOINT_ATTEMPT``; torchrun sets its own TORCHELASTIC_RESTART_COUNT for its workers).
Every process prints ``ATTEMPT a rank=R`` once it is set up.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0, help="MiB of float32 per all-reduce")
    parser.add_argument("--pause", type=float, default=0.2, help="seconds between steps")
    parser.add_argument("--limit", type=float, default=240.0, help="give up after S seconds")
    args = parser.parse_args()

    import torch  # late: the import is slow
    import torch.distributed as dist

    # Longer than any test waits: a peer that vanished must not end this process by a
    # gloo timeout; only `rallypoint run` (or the limit) may stop it.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.limit + 60))
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = os.environ.get("RALLYPOINT_ATTEMPT", "?")
    os.write(1, f"ATTEMPT {attempt} rank={rank}\n".encode())
    steps = int(os.environ.get("STEADY_STEPS", "0"))
    crash = os.environ.get("STEADY_CRASH_RANK")
    expected = float(world * (world + 1) / 2)
    tensor = torch.empty(max(1, int(args.mib * 2**20) // 4), dtype=torch.float32)
    deadline = time.monotonic() + args.limit
    step = 0
    while time.monotonic() < deadline:
        tensor.fill_(float(rank + 1))
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        if not bool(torch.all(tensor == expected)):
            os.write(2, f"rank {rank}: wrong sum at step {step}\n".encode())
            return 1
        if step == 0:
            # One write per line: the processes of a node share the job's output.
            os.write(1, f"RUNNING rank={rank}\n".encode())
            if crash == str(rank) and attempt == "0":
                os.write(1, f"CRASH rank={rank}\n".encode())
                os._exit(3)
        step += 1
        if step == steps:
            os.write(1, f"DONE rank={rank}\n".encode())
            return 0
        time.sleep(args.pause)
    os.write(2, f"rank {rank}: nothing stopped the job within {args.limit:g} s\n".encode())
    return 3


if __name__ == "__main__":
    sys.exit(main())
