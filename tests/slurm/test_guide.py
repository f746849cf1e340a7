"""Tier 5: the deploy guide's batch script, submitted with sbatch to a real Slurm cluster."""

from __future__ import annotations

import pytest

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import run_guide

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]


def test_guide_script_runs_every_rank(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    job, lines = run_guide(slurm, "guide", job_env)
    assert job.nodes == slurm_cluster.NODELIST, job.describe()
    # The first node of SLURM_JOB_NODELIST is the master. Its port is 29500 unless that
    # port is busy there (a previous job's connections in TIME_WAIT are enough).
    env = lines[0]["env"]
    assert env["SLURM_JOB_NODELIST"] == slurm_cluster.NODELIST
    assert env["MASTER_ADDR"] == slurm_cluster.NODES[0]
    assert 1 <= int(env["MASTER_PORT"]) <= 65535
    # torchrun's log directories went to the job's TMPDIR (tests/slurm/jobs.py), not /tmp.
    assert list(slurm.workdir.glob("jobs/*-guide/tmp/torchelastic_*")), job.describe()
