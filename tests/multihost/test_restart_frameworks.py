"""`rallypoint run --restarts` brings a TensorFlow and a JAX job back on every node.

Three namespace nodes run the real client under `rallypoint run --restarts 1`; in attempt 0
one task exits 3 at once (CLIENT_CRASH), while the others wait for it in the framework's
own set-up (MultiWorkerMirroredStrategy's collective group, JAX's coordinator). Every node's
`run` stops its client and starts it again as attempt 1 on the same ports (TF's worker
port, JAX's coordinator port, held by the sidecars), and the all-reduce completes there.
"""

from __future__ import annotations

import sys

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import MakeCluster
from tests.support.cluster.nodes import Node

pytestmark = [pytest.mark.multihost, pytest.mark.timeout(900)]

READY_S = 40.0
JOB_S = 420.0  # two attempts of three framework imports on two shared cores


def supervised(script: str) -> list[str]:
    run = ["-m", "rallypoint", "run", "--quiet", "--timeout", "300", "--restarts", "1"]
    return [sys.executable, *run, "--grace", "2", "--", *clients.python(script)]


def restarted(make_cluster: MakeCluster, frameworks: str, script: str, total: float) -> None:
    cluster = make_cluster(args=("--frameworks", frameworks))
    cluster.start_all()
    cluster.wait_all_ready(READY_S)

    def command(_node: Node) -> list[str]:
        return supervised(script)

    outcomes = clients.run_clients(
        list(cluster), command, timeout_s=JOB_S, label=frameworks, env={"CLIENT_CRASH": "1"}
    )
    report = clients.describe(outcomes)
    assert sum("CRASH" in o.log for o in outcomes.values()) == 1, report
    for outcome in outcomes.values():
        assert "restarting: attempt 1 on every node (1 of --restarts 1)" in outcome.log, report
    clients.one_full_sum_each(outcomes, total)


@pytest.mark.tensorflow
def test_a_tensorflow_job_restarts_on_every_node(make_cluster: MakeCluster) -> None:
    require_module("tensorflow", "pip install tensorflow-cpu")
    restarted(make_cluster, "tf", "tf_allreduce.py", 6.0)


@pytest.mark.jax
def test_a_jax_job_restarts_on_every_node(make_cluster: MakeCluster) -> None:
    require_module("jax", "pip install 'jax[cpu]'")
    restarted(make_cluster, "jax", "jax_allreduce.py", 6.0)
