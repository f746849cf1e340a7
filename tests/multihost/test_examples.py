"""The torch example of docs/examples, under torchrun with two workers per node: a worker
that hangs is named with its node and local rank on every node.

`rallypoint run --stall-timeout 5 -- torchrun --nproc-per-node 2 train_torch.py` on two
namespace hosts. Global rank 3 (sub1's local rank 1) hangs before its batch of step 20
while every other worker, sub1's local rank 0 included, waits for it in the all-reduce.
Each worker marks its own file, so sub1's progress is its local rank 1's, a step behind.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.clients import venv_tool
from tests.support.cluster.build import MakeCluster
from tests.support.cluster.procs import Proc, wait_all

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

HOSTS = ("main1", "sub1")
EXAMPLE = Path(__file__).parents[2] / "docs" / "examples" / "train_torch.py"
#: torch's import in four workers and gloo's set-up on a loaded two-core machine.
END_S = 240.0


def test_a_hung_torchrun_worker_is_named_with_its_node_and_local_rank(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = make_cluster(hosts=HOSTS, args=("--keepalive", "1")).ready(60.0)
    argv = [
        sys.executable, "-m", "rallypoint", "run", "--quiet", "--timeout", "60",
        "--stall-timeout", "5", "--grace", "2", "--",
        venv_tool("torchrun"), "--nproc-per-node", "2", str(EXAMPLE),
        "--steps", "100000", "--hang-at", "3:20",
    ]  # fmt: skip
    runs: dict[str, Proc] = {node.name: node.spawn(argv, label="run") for node in cluster}
    codes = wait_all(runs, END_S)
    assert codes == dict.fromkeys(HOSTS, 1), (codes, cluster.logs())
    stalled = "sub1 (rank 1) stalled at step 19 (collective), local rank 1, no progress for 5 s"
    behind = "rallypoint: sub1 (rank 1) is behind: its last progress was step 19 (collective),"
    for proc in runs.values():
        log = proc.log()
        assert stalled in log and behind in log, log[-3000:]
    for node in cluster:
        view = node.get("/job").json()
        oldest = view["progress"]["oldest"][0]
        assert (oldest["host"], oldest["step"], oldest["local_rank"]) == ("sub1", 19, 1), view
