"""DeepSpeed's launcher across the namespaces from the served hostfile, without ssh.

Each node runs ``rallypoint wait --hostfile FILE`` and then, under ``rallypoint exec``,
``deepspeed --hostfile FILE --no_ssh --node_rank $NODE_RANK --master_addr $MASTER_ADDR
--master_port $MASTER_PORT``: DeepSpeed reads the slots and the host order from the file
and starts its processes, which run a gloo all-reduce.
"""

from __future__ import annotations

import shlex
import sys

import pytest

from tests.conftest import require_module
from tests.multihost import clients
from tests.support.cluster.build import MakeCluster, backendai_order
from tests.support.cluster.nodes import Node

pytestmark = [pytest.mark.multihost, pytest.mark.deepspeed, pytest.mark.timeout(900)]

READY_S = 40.0
JOB_S = 400.0  # DeepSpeed imports torch and more: six workers and three launchers
NPROC = 2
LAUNCH = (
    'exec "$0" --hostfile "$1" --no_ssh --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR" '
    '--master_port "$MASTER_PORT" --no_local_rank "$2"'
)


def deepspeed_command(node: Node) -> list[str]:
    hostfile = node.cluster.workdir / f"{node.name}.hostfile"
    wait = [sys.executable, "-m", "rallypoint", "wait", "--timeout", "120",
            "--hostfile", str(hostfile), "--out", str(hostfile.with_suffix(".env"))]  # fmt: skip
    launch = clients.rallypoint_exec(
        ["sh", "-c", LAUNCH, clients.venv_tool("deepspeed"), str(hostfile),
         str(clients.ALLREDUCE)]
    )  # fmt: skip
    return ["sh", "-c", f"{shlex.join(wait)} && exec {shlex.join(launch)}"]


def test_deepspeed_no_ssh_launch_runs_from_the_served_hostfile(make_cluster: MakeCluster) -> None:
    require_module("deepspeed", "pip install deepspeed")
    cluster = make_cluster(args=("--nproc-per-node", str(NPROC)))
    cluster.start_all()
    cluster.wait_all_ready(READY_S)
    order = backendai_order(cluster.hosts)

    outcomes = clients.run_clients(
        list(cluster), deepspeed_command, timeout_s=JOB_S, label="deepspeed"
    )

    report = clients.describe(outcomes)
    expected_file = "".join(f"{name} slots={NPROC}\n" for name in order)
    ranks: list[int] = []
    for name, outcome in outcomes.items():
        assert (cluster.workdir / f"{name}.hostfile").read_text() == expected_file
        assert outcome.code == 0 and len(outcome.results) == NPROC, report
        node_rank = order.index(name)
        for result in outcome.results:
            assert result["ok"] and result["sum"] == result["expected"] == 21.0, report
            assert result["world_size"] == 6 and result["host"] == name
            ranks.append(result["rank"])
        # DeepSpeed numbers processes by the hostfile's order: the master's are 0 and 1.
        assert sorted(r["rank"] for r in outcome.results) == [2 * node_rank, 2 * node_rank + 1]
    assert sorted(ranks) == list(range(6))
