"""Tier 5: steps on part of the allocation, ranks out of list order, inconsistent variables."""

from __future__ import annotations

import re

import pytest

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import (
    NODES,
    NPROC_PER_NODE,
    TRAIN,
    check_every_rank,
    guide_section_block,
    runnable_guide_script,
    train_lines,
)
from tests.slurm.jobs import Job

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

#: Well below `rallypoint run`'s own wait (300 s): a job that hangs instead of failing
#: is cancelled at this point and the test fails.
FAIL_FAST_S = 120.0


def srun_block(script: str) -> str:
    """The script's srun command, from `srun` to the closing quote of its `bash -c`."""
    match = re.search(r"^srun .*?^'$", script, flags=re.MULTILINE | re.DOTALL)
    assert match is not None, script
    return match.group(0)


def error_lines(job: Job, variable: str) -> list[str]:
    return [line for line in job.lines("error: ") if variable in line]


def test_step_on_part_of_the_allocation_fails_at_once_naming_slurm_nnodes(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    script = runnable_guide_script()
    block = srun_block(script)
    assert block.startswith("srun bash -c"), block
    partial = block.replace("srun ", "srun --nodes=2 --ntasks=2 ", 1)
    job = slurm.run_job(
        script.replace(block, partial),
        "partial-slurm",
        args=[f"--nodes={NODES}"],
        env=job_env,
        files={"train.py": TRAIN},
        timeout_s=FAIL_FAST_S,
    )
    assert job.state == "FAILED", job.describe()
    errors = error_lines(job, "SLURM_NNODES=2")
    # At most one line per sidecar of the step, naming the variable and the job's list: the
    # first sidecar's exit 2 makes its task stop the step (the guide's scancel), and the
    # other may not have got as far as its own line.
    assert 1 <= len(errors) <= 2, job.describe()
    assert all("SLURM_JOB_NODELIST='gpu[07-09]'" in line for line in errors), errors
    assert "exit code 2" in job.output, job.describe()
    assert not train_lines(job), job.describe()


def test_step_with_its_own_host_list_completes(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    script = runnable_guide_script()
    step = guide_section_block("Heterogeneous jobs and partial steps")
    assert step.startswith("srun "), step
    job = slurm.run_job(
        script.replace(srun_block(script), step.rstrip("\n")),
        "partial-explicit",
        args=[f"--nodes={NODES}"],
        env=job_env,
        files={"train.py": TRAIN},
    )
    # Slurm gives a 2-node step the first two nodes of the job.
    lines = check_every_rank(job, slurm_cluster.NODES[:2], NPROC_PER_NODE)
    assert {line["env"]["MASTER_ADDR"] for line in lines} == {slurm_cluster.NODES[0]}
    assert {line["env"]["SLURM_JOB_NODELIST"] for line in lines} == {slurm_cluster.NODELIST}


def test_task_ranks_out_of_node_list_order(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str]
) -> None:
    """An arbitrary distribution puts task 0 on the last node; node ranks follow the list.

    SLURM_PROCID then counts gpu09, gpu08, gpu07 while SLURM_JOB_NODELIST reads
    gpu[07-09]: a script that takes SLURM_PROCID as the node rank and the list's head as
    the master would put rank 0 on one node and the master on another.
    """
    workdir_hosts = "\n".join(reversed(slurm_cluster.NODES)) + "\n"
    job = slurm.run_job(
        runnable_guide_script(),
        "arbitrary",
        args=[f"--nodes={NODES}", "--distribution=arbitrary"],
        env={**job_env, "SLURM_HOSTFILE": "hostfile"},
        files={"train.py": TRAIN, "hostfile": workdir_hosts},
    )
    lines = check_every_rank(job, slurm_cluster.NODES, NPROC_PER_NODE)
    procid = {line["host"]: int(line["env"]["SLURM_PROCID"]) for line in lines}
    nodeid = {line["host"]: int(line["env"]["SLURM_NODEID"]) for line in lines}
    assert procid == {"gpu09": 0, "gpu08": 1, "gpu07": 2}, job.describe()
    assert nodeid == {"gpu07": 0, "gpu08": 1, "gpu09": 2}, job.describe()
    assert {line["env"]["MASTER_ADDR"] for line in lines} == {"gpu07"}


@pytest.mark.parametrize(
    ("variable", "value", "fragment"),
    [
        ("SLURM_NODEID", "7", "SLURM_NODEID='7'"),
        ("SLURMD_NODENAME", "login1", "SLURMD_NODENAME='login1' is not in"),
        ("SLURM_NNODES", "4", "SLURM_NNODES=4 but SLURM_JOB_NODELIST"),
    ],
)
def test_inconsistent_environment_fails_the_job_fast(
    slurm: slurm_cluster.SlurmCluster,
    job_env: dict[str, str],
    variable: str,
    value: str,
    fragment: str,
) -> None:
    """One node's task sees a variable that contradicts the others: one line, exit 2, done.

    The value is changed inside the task, before the guide's commands, on gpu08 only, the
    way an environment carried over from another job or a wrapper would arrive.
    """
    script = runnable_guide_script()
    block = srun_block(script)
    first, rest = block.split("\n", 1)
    tamper = f'  [ "$SLURMD_NODENAME" != gpu08 ] || export {variable}={value}\n'
    job = slurm.run_job(
        script.replace(block, f"{first}\n{tamper}{rest}"),
        f"bad-{variable.lower()}",
        args=[f"--nodes={NODES}"],
        env=job_env,
        files={"train.py": TRAIN},
        timeout_s=FAIL_FAST_S,
    )
    assert job.state == "FAILED", job.describe()
    errors = error_lines(job, variable)
    assert len(errors) == 1 and fragment in errors[0], job.describe()
    assert "gpu08: task 1: Exited with exit code 2" in job.output, job.describe()
    assert not train_lines(job), job.describe()
