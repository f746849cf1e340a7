"""A real torch gloo job on a namespace cluster after the sidecars' verdict, and its fate.

For every scenario the sidecars give their verdict first; then they are stopped (their probe
windows would otherwise listen on the ports) and the gloo all-reduce runs on the same hosts
with the env the sidecars served (or, when they refuse to, the same env built by hand from
the master's /status), under the same fault.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.multihost import clients
from tests.support.cluster.build import Cluster, backendai_order
from tests.support.cluster.nodes import Node
from tests.support.netns import IFNAME, wait_for

VERDICT_S = 40.0
JOB_S = 90.0
#: gloo's own timeout for the job under a fault (its default is 30 min).
GLOO_TIMEOUT_S = "15"
#: How long a job the test expects to fail may run: twice gloo's timeout, and twice what a
#: healthy job of these tests takes (under 15 s with every test side by side). A cut
#: connection can hold gloo's connect past its timeout; such a job is killed here, which is
#: its fate without rallypoint too (it never completes).
FAILING_JOB_S = 2 * float(GLOO_TIMEOUT_S)

Results = dict[str, tuple[int | None, Any]]


def rank_of(cluster: Cluster, name: str) -> int:
    return backendai_order(cluster.hosts).index(name)


def hand_env(cluster: Cluster, name: str, master: str = "main1") -> dict[str, str]:
    """The env a node would serve (MASTER_PORT from the master's /status)."""
    port = cluster[master].status()["ports"]["master"]["port"]
    return {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(cluster.hosts)),
        "RANK": str(rank_of(cluster, name)),
        "GLOO_SOCKET_IFNAME": IFNAME,
    }


def run_job(
    cluster: Cluster,
    script: Path,
    envs: Mapping[str, Mapping[str, str]] | None = None,
    *,
    args: Sequence[str] = (),
    clock_offsets: Mapping[str, float] | None = None,
    wait_s: float = JOB_S,
) -> Results:
    """Stop the sidecars, then run the gloo all-reduce on every node; name -> (code, result).

    ``args`` go to the script (``--mib 4 --steps 5``: training-sized tensors);
    ``clock_offsets`` run a node's job with its clock shifted, as its sidecar's was;
    ``wait_s`` is how long the whole job may run (FAILING_JOB_S where it must fail).
    """
    envs = envs or {node.name: hand_env(cluster, node.name) for node in cluster}
    for node in cluster:
        if node.sidecar is not None:
            node.sidecar.stop()
    results: Results = {}
    procs = {
        node.name: node.spawn(
            [
                sys.executable,
                str(script),
                "--env-json",
                json.dumps(dict(envs[node.name])),
                "--timeout",
                GLOO_TIMEOUT_S,
                *args,
            ],
            label="torch",
            clock_offset_s=(clock_offsets or {}).get(node.name),
        )
        for node in cluster
    }
    deadline = time.monotonic() + wait_s
    for name, proc in procs.items():
        try:
            code: int | None = proc.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = None
        found = clients.parse_results(proc.log())
        results[name] = (code, found[-1] if found else None)
    return results


def job_completed(results: Results) -> bool:
    return all(code == 0 and r is not None and r["ok"] for code, r in results.values())


def job_seconds(results: Results) -> float:
    """The slowest node's all-reduce time (the script's elapsed_s)."""
    return max(float(r["elapsed_s"]) for _, r in results.values() if r is not None)


def wait_reason(node: Node, code: str, timeout_s: float = VERDICT_S) -> dict[str, Any]:
    """Wait until node's /env answers 503 with a reason of ``code``; that reason."""

    def probe() -> dict[str, Any] | None:
        for reason in node.not_ready_reasons() or []:
            if reason.get("code") == code:
                return reason
        return None

    return wait_for(probe, timeout_s=timeout_s, what=f"{node.name}: {code}", describe=node.describe)
