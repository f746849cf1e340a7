"""torchrun across the namespaces, launched by `rallypoint exec` with two processes per node.

Static rendezvous reads everything from the served PET_* (no flag at all); c10d takes the
served MASTER_ADDR:MASTER_PORT as its endpoint. rallypoint serves no PET_RDZV_* variable
(docs/env-contract.md says why), so the c10d line names them.
"""

from __future__ import annotations

import errno

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import MakeCluster, backendai_order

pytestmark = [pytest.mark.multihost, pytest.mark.torch, pytest.mark.timeout(900)]

READY_S = 40.0
JOB_S = 300.0  # nine torch imports (three agents, six workers) on two shared cores
NPROC = 2


# IPv6-only clusters run torchrun (static) in test_ipv6.py, on the bare address
# form that needs the most care; names resolving to IPv6 run TensorFlow and JAX there and in
# their own modules.
# Each backend once and each family once: c10d's store on names that resolve to both
# families, the static rendezvous on IPv4.
@pytest.mark.parametrize(
    ("backend", "family"),
    [
        pytest.param(clients.STATIC, "ipv4", id="static-ipv4"),
        pytest.param("c10d", "dual", id="c10d-dual"),
    ],
)
def test_torchrun_runs_two_processes_per_node_on_the_served_env(
    make_cluster: MakeCluster, backend: str, family: str
) -> None:
    require_module("torch", "pip install torch==2.13.0")
    cluster = make_cluster(args=("--nproc-per-node", str(NPROC)), family=family)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    order = backendai_order(cluster.hosts)
    master_port = int(served["main1"]["MASTER_PORT"])
    for name, values in served.items():
        assert values["PET_NPROC_PER_NODE"] == str(NPROC)
        assert values["WORLD_SIZE"] == "6"
        assert values["PET_NODE_RANK"] == str(order.index(name))
        assert values["PET_MASTER_ADDR"] == "main1"
        assert int(values["PET_MASTER_PORT"]) == master_port
        # torchrun sets these per process; serving them would contradict it.
        assert not {"RANK", "LOCAL_RANK", "PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND"} & set(values)
    assert cluster["main1"].try_bind(master_port) == errno.EADDRINUSE

    outcomes = clients.run_torchrun(list(cluster), backend, timeout_s=JOB_S)

    report = clients.describe(outcomes)
    ranks: list[int] = []
    for name, outcome in outcomes.items():
        assert outcome.code == 0 and len(outcome.results) == NPROC, report
        for result in outcome.results:
            assert result["ok"] and result["sum"] == result["expected"] == 21.0, report
            assert result["world_size"] == 6 and result["host"] == name
            assert sorted(result["hosts"]) == sorted(cluster.hosts * NPROC)
            ranks.append(result["rank"])
        if backend == clients.STATIC:
            # Static rendezvous keeps the served node rank: the master's processes are 0, 1.
            node_rank = order.index(name)
            assert sorted(r["rank"] for r in outcome.results) == [2 * node_rank, 2 * node_rank + 1]
    assert sorted(ranks) == list(range(6))
    # torchrun's log directories went to each node's TMPDIR, not to the machine's /tmp.
    assert all(list(node.tmpdir.glob("torchelastic_*")) for node in cluster), report
