"""Fixtures for tier 5: one real Slurm cluster per session, torn down whatever happens."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import has_failed, require
from tests.slurm import cluster as slurm_cluster
from tests.slurm.jobs import Job
from tests.slurm.runs import prerequisites, sweep_stale
from tests.support import allreduce
from tests.support.netns import base_environ

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "deploy" / "slurm.md"
#: The training script of the guide's `torchrun train.py`: the shared gloo all-reduce client.
TRAIN = Path(allreduce.__file__)
#: What the machine forces on the guide's script: three nodes of two cores, no GPUs.
NODES = 3
NPROC_PER_NODE = 2


@dataclass(frozen=True)
class Unavailable:
    """Why the session has no cluster: a missing prerequisite, or a cluster that broke."""

    reason: str
    missing: bool


@pytest.fixture(scope="package")
def slurm_session(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[slurm_cluster.SlurmCluster | Unavailable]:
    """The cluster (or why there is none): started once, closed after the tier's last test."""
    reason = prerequisites()
    if reason is not None:
        yield Unavailable(reason, missing=True)
        return
    sweep_stale()
    made = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        made.up()
    except Exception as exc:  # up() cleaned up; every test that needs the cluster fails
        yield Unavailable(f"the Slurm cluster did not come up: {exc}", missing=False)
        return
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def slurm(
    slurm_session: slurm_cluster.SlurmCluster | Unavailable, request: pytest.FixtureRequest
) -> Iterator[slurm_cluster.SlurmCluster]:
    """The session's cluster, all nodes idle; its hosts files are restored after the test."""
    if isinstance(slurm_session, Unavailable):
        # A missing prerequisite skips locally (fails in CI); a broken cluster always fails.
        require(not slurm_session.missing, f"Slurm tier: {slurm_session.reason}")
        pytest.fail(slurm_session.reason, pytrace=False)
    made = slurm_session
    made.wait_idle(60)
    yield made
    made.unpin_all()
    failed = has_failed(request.node)
    if failed:
        print(f"==== Slurm cluster ({made.workdir})\n{made.describe()}")


@pytest.fixture(scope="session")
def job_env() -> dict[str, str]:
    """What a submission adds to the environment: this Python's tools first on PATH.

    Every node shares this filesystem, so rallypoint and torchrun of the test environment
    are what the job runs, as they would be from a shared software directory.
    """
    require(
        importlib.util.find_spec("torch") is not None,
        "PyTorch is not installed (pip install torch==2.13.0)",
    )
    bindir = Path(sys.executable).parent
    path = f"{bindir}:{base_environ()['PATH']}"
    for tool in ("rallypoint", "torchrun"):
        require(
            shutil.which(tool, path=path) is not None,
            f"`{tool}` is not next to {sys.executable} nor on PATH",
        )
    return {"PATH": path}


def guide_script() -> str:
    """The deploy guide's batch script, as the guide prints it."""
    text = GUIDE.read_text()
    blocks = re.findall(r"```sh\n(#!/bin/bash\n.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, f"{GUIDE} should hold exactly one batch script, found {len(blocks)}"
    return blocks[0]


def guide_section_block(heading: str) -> str:
    """The first ```sh block under a heading of the guide."""
    text = GUIDE.read_text()
    start = text.index(f"\n## {heading}\n")
    block = re.search(r"```sh\n(.*?)```", text[start:], flags=re.DOTALL)
    assert block is not None, f"no sh block under '## {heading}' in {GUIDE}"
    return block.group(1)


def runnable_guide_script() -> str:
    """The guide's script with only what this machine forces changed.

    No GPUs: the ``--gpus-per-node`` line goes (Slurm would refuse a GPU request on nodes
    without GRES). Two cores: two processes per node instead of one per GPU. The node
    count is given on the sbatch command line (``--nodes=3``), which overrides the
    script's own ``#SBATCH --nodes``. Each change must apply exactly once, so an edit of
    the guide that this test does not know about fails here.
    """
    script = guide_script()
    gpu_lines = [line for line in script.splitlines() if line.startswith("#SBATCH --gpus")]
    assert len(gpu_lines) == 1, gpu_lines
    script = script.replace(gpu_lines[0] + "\n", "")
    nproc = re.findall(r"^export RALLYPOINT_NPROC_PER_NODE=\d+$", script, flags=re.MULTILINE)
    assert len(nproc) == 1, nproc
    script = script.replace(nproc[0], f"export RALLYPOINT_NPROC_PER_NODE={NPROC_PER_NODE}")
    assert re.search(r"^#SBATCH --nodes=\d+$", script, flags=re.MULTILINE), script
    assert "torchrun train.py" in script, script
    return script


def train_lines(job: Job) -> list[dict[str, Any]]:
    """Every `RESULT {...}` record the job printed, parsed, wherever it starts on a line."""
    decoder = json.JSONDecoder()
    found = []
    for match in re.finditer(r"RESULT (?=\{)", job.output):
        record, _ = decoder.raw_decode(job.output, match.end())
        found.append(record)
    return found


def check_every_rank(job: Job, nodes: tuple[str, ...], nproc: int) -> list[dict[str, Any]]:
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


def run_guide(
    slurm: slurm_cluster.SlurmCluster, name: str, env: dict[str, str]
) -> tuple[Job, list[dict[str, Any]]]:
    """The guide's batch script on every node with the torch client as train.py: the job,
    and every rank's line once check_every_rank passed."""
    job = slurm.run_job(
        runnable_guide_script(), name, args=[f"--nodes={NODES}"], env=env, files={"train.py": TRAIN}
    )
    return job, check_every_rank(job, slurm_cluster.NODES, NPROC_PER_NODE)
