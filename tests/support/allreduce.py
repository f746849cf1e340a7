"""The gloo all-reduce client: join the group, add rank + 1 everywhere, check the sum, report.

One script for every launcher. Each process prints one line ``RESULT {json}`` (what it saw:
ranks, sum, every process's host name, the env it ran with) and exits 0 only when the sum is
right and every rank took part:

    torchrun allreduce.py                       # torchrun, deepspeed: the env per process
    python allreduce.py --sidecar URL           # one process per node: GET URL/env first
    python allreduce.py --env-json '{...}'      # a hand-made env instead of the sidecar's
    python allreduce.py --mib 4 --steps 5 ...   # training-sized: 4 MiB of float32, 5 times

With ``--mib`` or ``--steps`` the line also has ``mib``, ``steps`` and ``elapsed_s`` (the
all-reduce steps only, not the group's set-up), and every element of every step is checked.

Run as a script (a job copies it as ``train.py``); it needs only the standard library and
torch, which it imports after the wait for the sidecar has started.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.error
import urllib.request
from datetime import timedelta

#: What the line shows of the environment: torchrun's, rallypoint's and Slurm's view.
SHOWN = (
    "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "LOCAL_RANK", "NODE_RANK", "NNODES",
    "GLOO_SOCKET_IFNAME", "RALLYPOINT_GENERATION",
    "SLURM_JOB_ID", "SLURM_NODEID", "SLURM_PROCID", "SLURMD_NODENAME", "SLURM_JOB_NODELIST",
)  # fmt: skip


def fetch_env(url: str, wait_s: float) -> dict[str, str]:
    """GET /env from the sidecar, long-polling and retrying until it serves or wait_s passes."""
    deadline = time.monotonic() + wait_s
    last = "no answer"
    while time.monotonic() < deadline:
        remaining = max(1, int(deadline - time.monotonic()))
        try:
            with urllib.request.urlopen(
                f"{url}/env?format=json&wait={remaining}", timeout=remaining + 5
            ) as resp:
                served: dict[str, str] = json.load(resp)
                return served
        except urllib.error.HTTPError as exc:
            last = f"{exc.code} {exc.read().decode(errors='replace').strip()}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise SystemExit(f"error: the sidecar at {url} did not serve /env within {wait_s:g} s: {last}")


def own_address() -> str | None:
    """What this host's own name resolves to here (127.0.1.1 when pinned Debian-style)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sidecar", default=None, help="take the env from this sidecar's /env")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for /env")
    parser.add_argument("--env-json", default=None, help="take this env (wins over --sidecar)")
    parser.add_argument("--timeout", type=float, default=120.0, help="gloo/store timeout, s")
    parser.add_argument(
        "--mib", type=float, default=None, help="all-reduce this many MiB of float32 (0: one)"
    )
    parser.add_argument("--steps", type=int, default=None, help="all-reduce this many times")
    args = parser.parse_args()
    sized = args.mib is not None or args.steps is not None
    mib: float = args.mib or 0.0
    steps: int = 1 if args.steps is None else args.steps
    if mib < 0 or steps < 1:
        parser.error("--mib must be >= 0 and --steps >= 1")

    if args.env_json:
        os.environ.update(json.loads(args.env_json))
    elif args.sidecar:
        os.environ.update(fetch_env(args.sidecar, args.wait))

    import torch  # late: the import is slow and the sidecar wait should start at once
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    expected = world * (world + 1) / 2
    elements = max(1, int(mib * 2**20) // 4)  # float32; --mib 0 keeps the single float
    tensor = torch.full((elements,), float(rank + 1), dtype=torch.float32)
    summed, elapsed = True, 0.0
    for step in range(steps):
        if step:
            tensor.fill_(float(rank + 1))
        started = time.monotonic()
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        elapsed += time.monotonic() - started
        summed = summed and bool(torch.all(tensor == expected))
        if step == 0 and steps > 1:
            # Past init_process_group and one collective: a test that kills a peer "while the
            # job runs" waits for this line, not for the store's connections (those are up
            # before gloo's full mesh, and a peer killed inside that mesh can hang the rest).
            os.write(1, f"RUNNING rank={rank}\n".encode())
    hosts: list[object] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()

    ok = summed and None not in hosts
    local_rank = os.environ.get("LOCAL_RANK")
    result = {
        "ok": ok,
        "rank": rank,
        "local_rank": None if local_rank is None else int(local_rank),
        "world_size": world,
        "sum": tensor[0].item(),
        "expected": expected,
        "hosts": hosts,
        "host": socket.gethostname(),
        "own_address": own_address(),
        "group_rank": os.environ.get("GROUP_RANK"),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "master_port": os.environ.get("MASTER_PORT"),
        "generation": os.environ.get("RALLYPOINT_GENERATION"),
        "env": {key: os.environ.get(key) for key in SHOWN},
    }
    if sized:
        result.update({"mib": mib, "steps": steps, "elapsed_s": round(elapsed, 4)})
    # The processes of a node may share one log: one write() per line keeps the lines whole
    # (print() may write the text and its newline separately, and they then interleave).
    os.write(1, ("RESULT " + json.dumps(result, sort_keys=True) + "\n").encode())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
