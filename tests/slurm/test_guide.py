"""Tier 5: the deploy guide's batch script, submitted with sbatch to a real Slurm cluster."""

from __future__ import annotations

from typing import Any

import pytest

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import (
    NODES,
    NPROC_PER_NODE,
    TRAIN,
    runnable_guide_script,
    train_lines,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def check_every_rank(
    job: slurm_cluster.Job, nodes: tuple[str, ...], nproc: int
) -> list[dict[str, Any]]:
    """Every process of the job printed its line, agreed on the sum and on the master."""
    assert job.state == "COMPLETED" and job.exit_code == "0:0", job.describe()
    lines = train_lines(job)
    world = len(nodes) * nproc
    assert sorted(line["rank"] for line in lines) == list(range(world)), job.describe()
    for line in lines:
        assert line["ok"] is True and line["world_size"] == world, line
        assert line["sum"] == world * (world + 1) / 2, line
        assert sorted(set(line["hosts"])) == sorted(nodes), line
    masters = {(line["env"]["MASTER_ADDR"], line["env"]["MASTER_PORT"]) for line in lines}
    assert len(masters) == 1, masters
    # torchrun's node rank is the sidecar's NODE_RANK: the node's place in the job's list.
    for line in lines:
        env = line["env"]
        assert env["SLURMD_NODENAME"] == line["host"], line
        assert int(env["GROUP_RANK"]) == nodes.index(line["host"]), line
    return lines


def test_guide_script_runs_every_rank(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    job = slurm.run_job(
        runnable_guide_script(),
        "guide",
        args=[f"--nodes={NODES}"],
        env=job_env,
        files={"train.py": TRAIN},
    )
    assert job.nodes == slurm_cluster.NODELIST, job.describe()
    lines = check_every_rank(job, slurm_cluster.NODES, NPROC_PER_NODE)
    # The first node of SLURM_JOB_NODELIST is the master. Its port is 29500 unless that
    # port is busy there (a previous job's connections in TIME_WAIT are enough).
    env = lines[0]["env"]
    assert env["SLURM_JOB_NODELIST"] == slurm_cluster.NODELIST
    assert env["MASTER_ADDR"] == slurm_cluster.NODES[0]
    assert 1 <= int(env["MASTER_PORT"]) <= 65535
