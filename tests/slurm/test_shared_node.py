"""Tier 5: two jobs on the same nodes, side by side, with no flag a user must remember.

Slurm runs the processes of every job in the node's one network namespace (no containers),
so two sessions' sidecars would both want 7780 and 7781. Each job's take the pair its
SLURM_JOB_ID gives (settings.job_ports), and so do its `run` and `wait`: both jobs become
ready and complete, each on its own ports.
"""

from __future__ import annotations

import shutil

import pytest

from rallypoint import settings
from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import NPROC_PER_NODE, TRAIN, check_every_rank, runnable_guide_script

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def test_two_jobs_on_the_same_nodes_both_complete_on_their_own_ports(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    # Two nodes and one process per node each: the sharing is the point, not the job's size.
    nproc = f"RALLYPOINT_NPROC_PER_NODE={NPROC_PER_NODE}"
    script = runnable_guide_script()
    assert script.count(nproc) == 1, script
    script = script.replace(nproc, "RALLYPOINT_NPROC_PER_NODE=1")
    nodes = slurm_cluster.NODES[:2]
    dirs = [slurm.job_dir(f"shared-{index}") for index in range(2)]
    for workdir in dirs:
        shutil.copy(TRAIN, workdir / "train.py")
    # Two cores per node and one task per node each: both jobs run at once on both nodes.
    ids = [slurm.submit(script, d, args=[f"--nodes={len(nodes)}"], env=job_env) for d in dirs]
    jobs = [slurm.wait_job(job_id, d, 240.0) for job_id, d in zip(ids, dirs, strict=True)]
    for job in jobs:
        check_every_rank(job, nodes, 1)
    first, second = (job.record for job in jobs)
    assert first["StartTime"] < second["EndTime"] and second["StartTime"] < first["EndTime"], (
        "the jobs did not run side by side",
        first,
        second,
    )
    pairs = [settings.job_ports({"SLURM_JOB_ID": job_id}) for job_id in ids]
    assert pairs[0] != pairs[1], pairs
    for job, pair in zip(jobs, pairs, strict=True):
        assert pair is not None
        # Every node's sidecar logged its listeners: the job's own pair, on every node.
        listening = [line for line in job.output.splitlines() if "listening" in line]
        assert len(listening) == len(nodes), job.describe()
        local, peer = f"127.0.0.1:{pair[0]}", f":{pair[1]}"
        assert all(local in line and peer in line for line in listening), listening
