"""A real JAX client: join the coordinator from the served env, all-gather across processes.

Run one per node under `rallypoint exec`, which puts the served env into os.environ:

    rallypoint exec -- python jax_allreduce.py

jax.distributed.initialize reads JAX_COORDINATOR_ADDRESS (and, on the master,
JAX_COORDINATOR_BIND_ADDRESS) itself; the count and the id are passed from the served
JAX_NUM_PROCESSES and JAX_PROCESS_ID. Prints one line ``RESULT {json}`` and exits 0 only
when every process's contribution arrived and the sum is right. With CLIENT_CRASH=N process
N exits 3 at once in attempt 0 (RALLYPOINT_ATTEMPT), for the restart tests.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main() -> int:
    crash = os.environ.get("CLIENT_CRASH")
    if crash == os.environ["JAX_PROCESS_ID"] and os.environ.get("RALLYPOINT_ATTEMPT") == "0":
        print(f"CRASH process {crash} in attempt 0", flush=True)  # the restart tests' fault
        return 3
    import jax  # late: the import is slow

    jax.config.update("jax_platforms", "cpu")
    # Cross-process collectives on CPU need an implementation; gloo needs nothing but TCP.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        num_processes=int(os.environ["JAX_NUM_PROCESSES"]),
        process_id=int(os.environ["JAX_PROCESS_ID"]),
        initialization_timeout=120,
    )
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    pid, count = jax.process_index(), jax.process_count()
    gathered = multihost_utils.process_allgather(jnp.array([float(pid + 1)]))
    values = [float(v) for v in gathered.reshape(-1)]
    total = float(jnp.sum(gathered))
    expected = count * (count + 1) / 2
    ok = total == expected and sorted(values) == [float(i + 1) for i in range(count)]
    jax.distributed.shutdown()
    print(
        "RESULT "
        + json.dumps(
            {
                "ok": ok,
                "process_id": pid,
                "process_count": count,
                "values": values,
                "sum": total,
                "expected": expected,
                "host": socket.gethostname(),
                "coordinator": os.environ.get("JAX_COORDINATOR_ADDRESS"),
                "bind": os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"),
            }
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
