"""JAX across the namespaces: the coordinator on the port the master's sidecar holds."""

from __future__ import annotations

import errno

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import MakeCluster, backendai_order
from tests.support.cluster.nodes import Node
from tests.support.netns import wait_for

pytestmark = [pytest.mark.multihost, pytest.mark.jax, pytest.mark.timeout(900)]

READY_S = 40.0
JOB_S = 240.0  # three JAX imports and XLA start-ups on two shared cores


@pytest.mark.parametrize("family", ["ipv4", "ipv6", "dual"])
def test_jax_collective_runs_on_the_served_env(make_cluster: MakeCluster, family: str) -> None:
    require_module("jax", "pip install 'jax[cpu]'")
    cluster = make_cluster(args=("--frameworks", "jax"), family=family)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    coordinator = served["main1"]["JAX_COORDINATOR_ADDRESS"]
    host, _, port_text = coordinator.rpartition(":")
    port = int(port_text)
    assert host == "main1", coordinator
    order = backendai_order(cluster.hosts)
    for name, values in served.items():
        assert values["JAX_COORDINATOR_ADDRESS"] == coordinator
        assert values["JAX_NUM_PROCESSES"] == "3"
        assert values["JAX_PROCESS_ID"] == str(order.index(name))
        assert values.get("JAX_COORDINATOR_BIND_ADDRESS") == (
            f"[::]:{port}" if name == "main1" else None
        )
        assert "MASTER_ADDR" not in values and "TF_CONFIG" not in values
    # The master's sidecar holds the coordinator port: a plain bind there fails ...
    assert cluster["main1"].try_bind(port) == errno.EADDRINUSE

    outcomes = clients.run_script(list(cluster), "jax_allreduce.py", timeout_s=JOB_S, label="jax")

    # ... while JAX's gRPC coordinator binds it, and every process sees every contribution.
    for name, result in clients.one_full_sum_each(outcomes, 6.0).items():
        assert result["process_count"] == 3
        assert result["process_id"] == order.index(name)
        assert result["host"] == name


def test_own_names_on_loopback_stay_fatal_with_jax_until_fixed(make_cluster: MakeCluster) -> None:
    """JAX's gloo ignores GLOO_SOCKET_IFNAME: an own name on 127.0.1.1 breaks it (measured).

    torch's gloo is pinned by the served GLOO_SOCKET_IFNAME and runs with the same hosts
    files (test_torch.py); with jax served the node must not turn ready. Once the hosts
    files are fixed, the same sidecars turn ready and the JAX job completes.
    """
    require_module("jax", "pip install 'jax[cpu]'")
    cluster = make_cluster(args=("--frameworks", "torch,jax"))
    for node in cluster:
        node.pin(node.name, "127.0.1.1")
    cluster.start_all()

    for node in cluster:

        def self_loopback(node: Node = node) -> list[dict[str, object]] | None:
            reasons = node.not_ready_reasons() or []
            found = [r for r in reasons if r.get("code") == "self_loopback"]
            return found or None

        found = wait_for(self_loopback, timeout_s=READY_S, what=f"{node.name} self_loopback")
        message = str(found[0]["message"])
        assert node.name in message and "127.0.1.1" in message
        assert "JAX's gloo ignores GLOO_SOCKET_IFNAME" in message

    for node in cluster:
        node.unpin()
    cluster.wait_all_ready(READY_S * 2)
    outcomes = clients.run_script(list(cluster), "jax_allreduce.py", timeout_s=JOB_S, label="jax")
    report = clients.describe(outcomes)
    for outcome in outcomes.values():
        assert outcome.code == 0 and len(outcome.results) == 1, report
        assert outcome.results[0]["ok"] and outcome.results[0]["sum"] == 6.0, report
