"""A real torchrun worker: gloo from the env torchrun set per process, all-reduce, check.

Launched per node as ``rallypoint exec -- torchrun torchrun_allreduce.py`` (static
rendezvous from the served PET_*) or with ``--rdzv-backend c10d``; torchrun starts
PET_NPROC_PER_NODE copies and sets RANK, LOCAL_RANK and WORLD_SIZE for each. Every copy
prints one line ``RESULT {json}`` and exits 0 only when the sum is right.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta


def main() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    hosts: list[object] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()
    expected = world * (world + 1) / 2
    ok = tensor.item() == expected and None not in hosts
    result = {
        "ok": ok,
        "rank": rank,
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "world_size": world,
        "sum": tensor.item(),
        "expected": expected,
        "hosts": hosts,
        "host": socket.gethostname(),
        "group_rank": os.environ.get("GROUP_RANK"),
    }
    # Two processes per node share one log: one write() per line keeps the lines whole
    # (print() may write the text and its newline separately, and they then interleave).
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
