"""The guide's batch script with each node's `rallypoint run` status recorded, for the tests
that submit it with a never-ending (or step-counted) trainer: test_requeue.py, test_restart.py.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.slurm import cluster as slurm_cluster
from tests.slurm.conftest import NODES, runnable_guide_script

TRAIN = Path(__file__).with_name("steady_train.py")
#: The guide's last command, and what the test runs instead: the same command, then its
#: status and the time it ended written to a file of the node's own (the job's directory
#: is on the filesystem every node shares), then the same exit.
RUN_LINE = "  rallypoint run --restarts 3 --rejoin-timeout 0 -- torchrun train.py\n"
RECORDED_RUN = """\
  rallypoint run --restarts 3 --rejoin-timeout 0 -- torchrun train.py
  status=$?
  echo "$status $(date +%s.%N)" > "status/$SLURMD_NODENAME.tmp"
  mv "status/$SLURMD_NODENAME.tmp" "status/$SLURMD_NODENAME"
  exit $status
"""


@dataclass(frozen=True)
class Ended:
    """How one node's `rallypoint run` ended: its exit status, and when (epoch seconds)."""

    status: int
    at: float


def requeue_script() -> str:
    """The guide's script, one process per node, each node's `run` status recorded."""
    script = runnable_guide_script()
    assert script.count(RUN_LINE) == 1, script
    assert "#SBATCH --requeue\n" in script, "the guide's job must ask to be requeued"
    script = re.sub(
        r"^export RALLYPOINT_NPROC_PER_NODE=\d+$",
        "export RALLYPOINT_NPROC_PER_NODE=1",
        script,
        flags=re.MULTILINE,
    )
    return script.replace(RUN_LINE, RECORDED_RUN)


def output(workdir: Path, job_id: str) -> str:
    path = workdir / f"slurm-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def ended(workdir: Path, name: str) -> Ended | None:
    path = workdir / "status" / name
    if not path.exists():
        return None
    status, at = path.read_text().split()
    return Ended(int(status), float(at))


def submit(
    slurm: slurm_cluster.SlurmCluster, job_env: dict[str, str], label: str
) -> tuple[Path, str]:
    """Submit the recorded guide script with the never-ending trainer: (workdir, job id)."""
    workdir = slurm.job_dir(label)
    shutil.copy(TRAIN, workdir / "train.py")
    (workdir / "status").mkdir()
    job_id = slurm.submit(requeue_script(), workdir, args=[f"--nodes={NODES}"], env=job_env)
    return workdir, job_id
