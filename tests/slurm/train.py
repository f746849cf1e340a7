"""The training script of the Slurm tier: what `torchrun train.py` runs in the deploy guide.

Each process joins the gloo group from the env torchrun gives it (which torchrun built
from the PET_* variables rallypoint served), all-reduces its rank + 1, checks the sum,
gathers every process's host name, and prints one line:

    train {"ok": true, "rank": 3, "world_size": 6, ...}

It exits 1 when the sum is wrong, so a job whose processes disagree fails.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

#: What the line shows of the environment: torchrun's, rallypoint's and Slurm's view.
SHOWN = (
    "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_RANK", "NODE_RANK", "NNODES",
    "GLOO_SOCKET_IFNAME", "RALLYPOINT_GENERATION",
    "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST",
)  # fmt: skip


def main() -> int:
    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    hosts: list[object] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()

    expected = world * (world + 1) / 2
    ok = tensor.item() == expected and None not in hosts
    line = {
        "ok": ok,
        "rank": rank,
        "world_size": world,
        "sum": tensor.item(),
        "expected": expected,
        "host": socket.gethostname(),
        # What this node's own name resolves to here: 127.0.1.1 when Debian-style pinned.
        "own_address": socket.gethostbyname(socket.gethostname()),
        "hosts": hosts,
        "env": {key: os.environ.get(key) for key in SHOWN},
    }
    # One write: the node's two processes share the task's stdout, and print() would
    # write the line and its newline separately, letting the other process cut in.
    sys.stdout.write("train " + json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
