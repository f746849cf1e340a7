"""Tier 5: a crash restarts inside the allocation, with the guide's `--restarts`.

The guide's batch script runs steady_train.py (a gloo all-reduce loop) for a fixed number
of steps; rank 1 crashes after its first step of attempt 0. Every node's `rallypoint run`
stops torchrun and starts it again as attempt 1, together; the job then completes in the
same allocation: COMPLETED, exit 0:0, `Restarts=0` (Slurm never saw a failure), every rank
set up in attempt 1, and every node's `run` ended 0.
"""

from __future__ import annotations

import contextlib
import re
import time

import pytest

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import NODES
from tests.slurm.recorded import ended, output, submit

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

#: Torch starting on three nodes of a shared two-core machine, twice.
COMPLETE_TIMEOUT_S = 300.0


def test_a_crash_restarts_in_the_same_allocation_and_completes(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    env = {**job_env, "STEADY_STEPS": "30", "STEADY_CRASH_RANK": "1"}
    workdir, job_id = submit(slurm, env, "restart")
    started = time.time()
    try:
        job = slurm.wait_job(job_id, workdir, COMPLETE_TIMEOUT_S)
    finally:
        with contextlib.suppress(Exception):
            slurm.cancel(job_id)
    text = output(workdir, job_id)
    assert job.state == "COMPLETED" and job.exit_code == "0:0", (job.describe(), text)
    assert job.record.get("Restarts") == "0", job.record
    assert "CRASH rank=1" in text, text
    for rank in range(NODES):
        assert f"ATTEMPT 0 rank={rank}" in text and f"ATTEMPT 1 rank={rank}" in text, text
        assert f"DONE rank={rank}" in text, text
    restarts = re.findall(
        r"rallypoint: restarting: attempt 1 on every node \(1 of --restarts 3\)", text
    )
    assert len(restarts) == NODES, text
    statuses = {name: ended(workdir, name) for name in slurm_cluster.NODES}
    assert {name: e.status if e else None for name, e in statuses.items()} == dict.fromkeys(
        slurm_cluster.NODES, 0
    ), text
    print(f"job {job_id}: completed in one allocation {time.time() - started:.1f} s after sbatch")
