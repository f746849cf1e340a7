"""IPv6-only clusters where the served values are addresses: every form that needs brackets.

With host names (the other real-client tests run on IPv6-only clusters too) no address
appears in the env. Here it does: either the orchestrator lists the nodes by IPv6 address
(explicit provider), or `--master-addr ip` serves the master's verified address. torch's
env:// (MASTER_ADDR bare, as TCPStore takes it), TensorFlow (TF_CONFIG addresses in
brackets) and JAX (JAX_COORDINATOR_ADDRESS in brackets) all run from what was served.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.nodes import Node

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.torch,
    pytest.mark.tensorflow,
    pytest.mark.jax,
    pytest.mark.timeout(900),
]

READY_S = 40.0
JOB_S = 300.0
ARGS = ("--frameworks", "torch,tf,jax")


def explicit_by_address(cluster: Cluster, node: Node) -> Mapping[str, str]:
    """The explicit provider with the nodes listed by IPv6 address, the master not first."""
    return {
        "RALLYPOINT_HOSTS": ",".join(n.address for n in cluster),
        "RALLYPOINT_MASTER": cluster["main1"].address,
        "RALLYPOINT_NODE_RANK": str(node.index),
        "RALLYPOINT_SESSION": cluster.session,
    }


@pytest.mark.parametrize("listed_by", ["address", "name-master-addr-ip"])
def test_torch_tf_and_jax_run_on_served_ipv6_addresses(
    make_cluster: MakeCluster, listed_by: str
) -> None:
    require_module("torch", "pip install torch==2.13.0")
    require_module("tensorflow", "pip install tensorflow-cpu")
    require_module("jax", "pip install 'jax[cpu]'")
    if listed_by == "address":
        cluster = make_cluster(args=ARGS, family="ipv6", environ_for=explicit_by_address)
    else:
        cluster = make_cluster(args=(*ARGS, "--master-addr", "ip"), family="ipv6")
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    master = cluster["main1"].address
    assert ":" in master  # an IPv6 address
    for name, values in served.items():
        # torch: bare, as TCPStore and torchrun's host:port parsing take it.
        assert values["MASTER_ADDR"] == values["PET_MASTER_ADDR"] == master
        assert values["JAX_COORDINATOR_ADDRESS"].startswith(f"[{master}]:")
        if name == "main1":
            assert values["JAX_COORDINATOR_BIND_ADDRESS"].startswith("[::]:")
        tasks = json.loads(values["TF_CONFIG"])["cluster"]["worker"]
        if listed_by == "address":
            # Rank 0 (the master) first, every node once, each address in brackets.
            assert tasks[0].rpartition(":")[0] == f"[{master}]"
            assert {task.rpartition(":")[0] for task in tasks} == {
                f"[{n.address}]" for n in cluster
            }
        else:
            assert all(not task.startswith("[") for task in tasks)  # names need no brackets

    torch_results = clients.run_torch_job(list(cluster), clients.ALLREDUCE, timeout_s=JOB_S)
    for name, (code, result) in torch_results.items():
        assert code == 0 and result is not None and result["ok"], (name, code, result)
        assert result["sum"] == 6.0 and result["master_addr"] == master

    if listed_by != "address":
        return  # TF_CONFIG by name and the bracketed coordinator run in the other cases
    for label, script in (("tf", "tf_allreduce.py"), ("jax", "jax_allreduce.py")):
        outcomes = clients.run_script(list(cluster), script, timeout_s=JOB_S, label=label)
        report = clients.describe(outcomes)
        for outcome in outcomes.values():
            assert outcome.code == 0 and len(outcome.results) == 1, report
            result = outcome.results[0]
            assert result["ok"] and result["sum"] == result["expected"] == 6.0, report


@pytest.mark.parametrize("backend", ["static"])
def test_torchrun_takes_a_bare_ipv6_master_addr(make_cluster: MakeCluster, backend: str) -> None:
    """torchrun joins MASTER_ADDR and MASTER_PORT with a colon and splits at the last one.
    Static rendezvous reads the served PET_MASTER_ADDR itself; c10d's endpoint is the same
    join, written by the user's shell line (test_torchrun.py runs c10d)."""
    require_module("torch", "pip install torch==2.13.0")
    cluster = make_cluster(
        args=("--frameworks", "torch", "--master-addr", "ip", "--nproc-per-node", "2"),
        family="ipv6",
    )
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    master = cluster["main1"].address
    assert {values["PET_MASTER_ADDR"] for values in served.values()} == {master}

    outcomes = clients.run_torchrun(list(cluster), backend, timeout_s=JOB_S)

    report = clients.describe(outcomes)
    ranks = []
    for outcome in outcomes.values():
        assert outcome.code == 0 and len(outcome.results) == 2, report
        for result in outcome.results:
            assert result["ok"] and result["sum"] == 21.0, report
            ranks.append(result["rank"])
    assert sorted(ranks) == list(range(6))
