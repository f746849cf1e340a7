"""Real framework clients across a namespace cluster, each started by `rallypoint exec`.

Every client script prints ``RESULT {json}`` once per process; ``run_clients`` starts one
command per node, waits for all of them and collects those lines.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import allreduce
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.nodes import Node

HERE = Path(__file__).parent
#: The gloo all-reduce client every torch launcher runs (tests/support/allreduce.py).
ALLREDUCE = Path(allreduce.__file__)
#: Keep the clients small on a shared two-core machine.
QUIET_ENV = {
    "OMP_NUM_THREADS": "1",
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "JAX_PLATFORMS": "cpu",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def rallypoint_exec(command: Sequence[str], *, timeout_s: float = 120.0) -> list[str]:
    """`rallypoint exec -- COMMAND`: wait for the local sidecar, then run with its env."""
    return [sys.executable, "-m", "rallypoint", "exec", "--timeout", f"{timeout_s:g}", "--",
            *command]  # fmt: skip


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE / script), *args]


def venv_tool(name: str) -> str:
    """A console script installed beside this interpreter (torchrun, deepspeed)."""
    return str(Path(sys.executable).with_name(name))


@dataclass
class Outcome:
    """What one node's client did: exit code (None: killed at the timeout) and its results."""

    code: int | None
    results: list[dict[str, Any]] = field(default_factory=list)
    log: str = ""


def run_clients(
    nodes: Sequence[Node],
    command: Callable[[Node], Sequence[str]],
    *,
    timeout_s: float,
    label: str,
    env: Mapping[str, str] | None = None,
) -> dict[str, Outcome]:
    """Start command(node) on every node at once; wait for all; name -> Outcome."""
    merged = {**QUIET_ENV, **(env or {})}
    procs = {node.name: node.spawn(command(node), env=merged, label=label) for node in nodes}
    deadline = time.monotonic() + timeout_s
    outcomes: dict[str, Outcome] = {}
    for name, proc in procs.items():
        try:
            code: int | None = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        text = proc.log()
        results = parse_results(text)
        outcomes[name] = Outcome(code, results, text)
    return outcomes


def run_script(
    nodes: Sequence[Node], script: str, *, timeout_s: float, label: str
) -> dict[str, Outcome]:
    """``python script`` (a client beside this module) on every node, under `rallypoint exec`."""
    command = rallypoint_exec(python(script))
    return run_clients(nodes, lambda _node: command, timeout_s=timeout_s, label=label)


def parse_results(text: str) -> list[dict[str, Any]]:
    """Every ``RESULT {json}`` in a log, also where processes sharing it wrote on one line."""
    decoder = json.JSONDecoder()
    results = []
    for line in text.splitlines():
        for chunk in line.split("RESULT ")[1:]:
            value, _ = decoder.raw_decode(chunk)
            results.append(value)
    return results


def one_full_sum_each(outcomes: Mapping[str, Outcome], total: float) -> dict[str, dict[str, Any]]:
    """Every node's client exited 0 with one result whose all-reduced sum is ``total``."""
    report = describe(outcomes)
    for outcome in outcomes.values():
        assert outcome.code == 0 and len(outcome.results) == 1, report
        result = outcome.results[0]
        assert result["ok"] and result["sum"] == result["expected"] == total, report
    return {name: outcome.results[0] for name, outcome in outcomes.items()}


def describe(outcomes: Mapping[str, Outcome], tail_lines: int = 25) -> str:
    """Exit codes and log tails, for assertion messages."""
    parts = []
    for name, outcome in outcomes.items():
        tail = "\n".join(outcome.log.splitlines()[-tail_lines:])
        parts.append(f"--- {name}: exit {outcome.code}\n{tail}")
    return "\n".join(parts)


#: torchrun with no flags: static rendezvous, every value from the served PET_*.
STATIC = "static"
#: c10d: the endpoint from the served env (expanded by the shell that `exec` starts).
C10D = (
    'exec "$0" --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" '
    '--rdzv-id "$RALLYPOINT_GENERATION" "$1"'
)


def torchrun_command(backend: str) -> list[str]:
    script = str(ALLREDUCE)
    if backend == STATIC:
        return rallypoint_exec([venv_tool("torchrun"), script])
    return rallypoint_exec(["sh", "-c", C10D, venv_tool("torchrun"), script])


def run_torch_job(
    nodes: Sequence[Node], script: Path, *, timeout_s: float = 60.0
) -> dict[str, tuple[int | None, Any]]:
    """Run the all-reduce client on each node against its own sidecar.

    Returns name -> (exit code, the result it printed or None); a client still running
    after timeout_s is killed and reported with exit code None.
    """
    sidecar = f"http://127.0.0.1:{LOCAL_PORT}"
    outcomes = run_clients(
        nodes,
        lambda _node: [sys.executable, str(script), "--sidecar", sidecar, "--timeout", "30"],
        timeout_s=timeout_s,
        label="torch",
    )
    return {name: (o.code, o.results[-1] if o.results else None) for name, o in outcomes.items()}


def run_torchrun(nodes: Sequence[Node], backend: str, *, timeout_s: float) -> dict[str, Outcome]:
    """torchrun with ``backend`` on every node, under `rallypoint exec`."""
    command = torchrun_command(backend)
    return run_clients(nodes, lambda _node: command, timeout_s=timeout_s, label="torchrun")
