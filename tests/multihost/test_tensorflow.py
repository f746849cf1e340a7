"""TensorFlow MultiWorkerMirroredStrategy across the namespaces from the served TF_CONFIG."""

from __future__ import annotations

import errno
import json

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import MakeCluster, backendai_order

pytestmark = [pytest.mark.multihost, pytest.mark.tensorflow, pytest.mark.timeout(900)]

READY_S = 40.0
JOB_S = 300.0  # three TensorFlow imports on two shared cores


@pytest.mark.parametrize(
    ("layout", "family"),
    [
        pytest.param("workers", "ipv4", id="workers-ipv4"),
        pytest.param("workers", "ipv6", id="workers-ipv6"),
        pytest.param("chief", "dual", id="chief-dual"),
    ],
)
def test_multi_worker_all_reduce_runs_on_the_served_tf_config(
    make_cluster: MakeCluster, layout: str, family: str
) -> None:
    require_module("tensorflow", "pip install tensorflow-cpu")
    cluster = make_cluster(args=("--frameworks", "tf", "--tf-layout", layout), family=family)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    order = backendai_order(cluster.hosts)
    configs = {name: json.loads(values["TF_CONFIG"]) for name, values in served.items()}
    clusters = {json.dumps(c["cluster"], sort_keys=True) for c in configs.values()}
    assert len(clusters) == 1, clusters
    for name, config in configs.items():
        rank = order.index(name)
        if layout == "chief":
            expected = (
                {"type": "chief", "index": 0}
                if rank == 0
                else {"type": "worker", "index": rank - 1}
            )
        else:
            expected = {"type": "worker", "index": rank}
        assert config["task"] == expected
        # Each node's TF port is held by its own sidecar: a plain bind fails there ...
        tasks = config["cluster"][expected["type"]]
        own = tasks[expected["index"]]
        assert own.rpartition(":")[0] == name
        assert cluster[name].try_bind(int(own.rpartition(":")[2])) == errno.EADDRINUSE

    outcomes = clients.run_script(list(cluster), "tf_allreduce.py", timeout_s=JOB_S, label="tf")

    # ... while TensorFlow's gRPC server binds it, and every task gets the full sum.
    for name, result in clients.one_full_sum_each(outcomes, 6.0).items():
        assert result["replicas"] == 3 and result["host"] == name
        assert result["task"] == configs[name]["task"]
