"""A real training client: take the env from the local sidecar, join gloo, all-reduce, check.

Run one per node. Prints one JSON line with what it saw and exits 0 only when the
all-reduce returned the expected sum and every rank took part:

    python torch_allreduce.py [--url http://127.0.0.1:7780] [--wait 30] [--timeout 30]

``--env-json '{"MASTER_ADDR": ...}'`` skips the sidecar (to compare against a hand-made env).
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:7780")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for /env")
    parser.add_argument("--timeout", type=float, default=30.0, help="gloo/store timeout, s")
    parser.add_argument("--env-json", default=None, help="use this env instead of the sidecar")
    args = parser.parse_args()

    served = json.loads(args.env_json) if args.env_json else fetch_env(args.url, args.wait)
    os.environ.update(served)

    import torch  # late: the import is slow and the sidecar wait should start at once
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    tensor = torch.tensor([float(rank + 1)])
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    hosts: list[object] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    dist.destroy_process_group()

    expected = world * (world + 1) / 2
    ok = tensor.item() == expected and None not in hosts
    print(
        json.dumps(
            {
                "ok": ok,
                "rank": rank,
                "world_size": world,
                "sum": tensor.item(),
                "expected": expected,
                "hosts": hosts,
                "master_addr": os.environ.get("MASTER_ADDR"),
                "master_port": os.environ.get("MASTER_PORT"),
                "generation": os.environ.get("RALLYPOINT_GENERATION"),
            }
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
