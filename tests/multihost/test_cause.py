"""The cause of the first failure, named on every node: a real torch job's exception.

sub2's rank raises RuntimeError after step 2 inside torch's `@record` (tests/support/steps.py
--raise), which writes the exception to TORCHELASTIC_ERROR_FILE: `rallypoint run` gives each
attempt's child that file and reads it back when the child fails. Under torchrun, torchrun
copies its failed worker's file over its own, with the worker's exit status. Every node's
first-failure line, and every sidecar's GET /job, carry the exception.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.clients import venv_tool
from tests.support import steps
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.procs import Proc, wait_all

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

HOSTS = ("main1", "sub1", "sub2")
READY_S = 60.0
#: torch's import and gloo's set-up on a loaded two-core machine, then the steps.
END_S = 240.0
STEPS = Path(steps.__file__)
#: sub2 (rank 2) raises after step 2; the others compute 6 s then, so that the stop reaches
#: them before they meet its closed connections.
JOB = ("--mib", "4", "--compute-s", "6", "--raise", "2:2")
CAUSE = "RuntimeError: planted failure at step 2"


def start(make_cluster: MakeCluster) -> Cluster:
    return make_cluster(hosts=HOSTS, args=("--keepalive", "1")).ready(READY_S)


def supervise(cluster: Cluster, *command: str) -> dict[str, Proc]:
    argv = [sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60", "--"]
    return {node.name: node.spawn([*argv, *command], label="run") for node in cluster}


def first_failure(proc: Proc) -> str:
    found = [x for x in proc.log().splitlines() if x.startswith("rallypoint: first failure:")]
    assert found, proc.log()[-3000:]
    return found[-1]


def assert_named_everywhere(cluster: Cluster, runs: dict[str, Proc], cause: str) -> None:
    for name, proc in runs.items():
        line = first_failure(proc)
        assert f"sub2 (rank 2) exited 1: {cause}" in line, (name, line)
    for node in cluster:
        first = node.get("/job").json()["first"]
        assert (first["host"], first["what"]) == ("sub2", f"exited 1: {cause}"), first


def test_a_recorded_torch_jobs_exception_is_named_on_every_node(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    runs = supervise(cluster, sys.executable, str(STEPS), *JOB)
    codes = wait_all(runs, END_S)
    assert codes == dict.fromkeys(HOSTS, 1), (codes, cluster.logs())
    assert_named_everywhere(cluster, runs, CAUSE)


def test_under_torchrun_the_failed_workers_exception_is_named_on_every_node(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    # torchrun's static rendezvous from the served PET_* (one process per node).
    runs = supervise(cluster, venv_tool("torchrun"), str(STEPS), *JOB)
    codes = wait_all(runs, END_S)
    assert codes == dict.fromkeys(HOSTS, 1), (codes, cluster.logs())
    assert_named_everywhere(cluster, runs, f"{CAUSE} (worker exit 1)")
