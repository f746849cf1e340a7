"""A torch training loop for `rallypoint run`: its hangs named, its crashes explained.

    rallypoint run --stall-timeout 60 -- torchrun --nproc-per-node 2 train_torch.py --steps 1000

* **Progress.** Each step marks the worker's progress file twice: once its batch is loaded
  (``STEP data``), once before the gradients' all-reduce (``STEP collective``). A worker
  stuck loading its batch never writes its ``data`` mark while the others write both and
  wait for it, so its node's progress stops a step before theirs and every node names it
  (docs/run.md "Hangs: progress and stalls"). Under torchrun each worker marks a file of its
  own, ``$RALLYPOINT_PROGRESS_FILE.$LOCAL_RANK``: the node's progress is its oldest worker's.
* **Cause.** ``@record`` writes an exception to ``TORCHELASTIC_ERROR_FILE``; torchrun copies
  its failed worker's file to its own, and `run` carries it to every node as the first
  failure's cause ("sub2 (rank 2) exited 1: RuntimeError: ...").

``--hang-at RANK:STEP`` makes that global rank hang before its batch of STEP, to see a hang
named; ``--fail-at RANK:STEP`` makes it raise, to see a cause carried.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def progress_file() -> str | None:
    """This worker's progress file: its own under torchrun, else the one `run` gave."""
    path = os.environ.get("RALLYPOINT_PROGRESS_FILE")
    if path and "LOCAL_RANK" in os.environ:
        path += "." + os.environ["LOCAL_RANK"]
    return path


def mark(path: str | None, step: int, phase: str) -> None:
    """One progress mark: a few microseconds in /dev/shm, where `run` puts the file."""
    if path:
        with open(path, "w") as marking:
            marking.write(f"{step} {phase}")


def rank_step(text: str) -> tuple[int, int]:
    rank, step = text.split(":")
    return int(rank), int(step)


@record
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hang-at", type=rank_step, metavar="RANK:STEP")
    parser.add_argument("--fail-at", type=rank_step, metavar="RANK:STEP")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    path = progress_file()
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        if args.hang_at == (rank, step):
            time.sleep(3600)  # the batch never comes
        batch = torch.randn(64, 256)
        mark(path, step, "data")
        loss = model(batch).square().mean()
        optimizer.zero_grad()
        loss.backward()
        if args.fail_at == (rank, step):
            raise RuntimeError(f"planted failure at step {step}")
        mark(path, step, "collective")
        for param in model.parameters():
            assert param.grad is not None
            dist.all_reduce(param.grad)
            param.grad /= world
        optimizer.step()
    print(f"rank {rank} done after {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
