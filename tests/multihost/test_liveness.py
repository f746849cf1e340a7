"""After ready, a node that dies, stops or is cut off is named by the others, and cleared.

The bound waited for is the liveness bound (docs/readiness.md "After ready"): named after
4 keep-alive intervals of silence, heard of by the others within one more interval; the
waits below add slack for a loaded machine and stop the test, they time nothing.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest

from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.layout import LOCAL_PORT
from tests.support.cluster.nodes import Node
from tests.support.netns import wait_for

pytestmark = pytest.mark.multihost

HOSTS = ("sub1", "main1", "sub2", "sub3")
INTERVAL_S = 1.0
#: 4 intervals of silence, one to hear of it, and slack.
NAMED_S = 4 * INTERVAL_S + INTERVAL_S + 10.0
READY_S = 40.0


def named(node: Node, host: str) -> dict[str, Any] | None:
    """``host``'s entry in node's liveness.down, None while it is not named."""
    section = node.status().get("liveness") or {}
    return next((d for d in section.get("down", []) if d["host"] == host), None)


def wait_named(cluster: Cluster, host: str, by: list[str]) -> dict[str, dict[str, Any]]:
    return {
        name: wait_for(
            lambda name=name: named(cluster[name], host),  # type: ignore[misc]
            timeout_s=NAMED_S,
            what=f"{name} to name {host} down",
            describe=cluster[name].describe,
        )
        for name in by
    }


def cleared(node: Node) -> bool:
    """Whether node answers and names nobody down (a restarted sidecar may not listen yet)."""
    reply = node.try_get("/status")
    return reply is not None and reply.status == 200 and not reply.json()["liveness"]["down"]


def wait_cleared(cluster: Cluster) -> None:
    for node in cluster:
        wait_for(
            lambda node=node: cleared(node),  # type: ignore[misc]
            timeout_s=READY_S,
            what=f"{node.name}'s down list to clear",
            describe=node.describe,
        )


def start(make_cluster: MakeCluster) -> Cluster:
    return make_cluster(hosts=HOSTS, args=("--keepalive", str(INTERVAL_S))).ready(READY_S)


def test_a_dead_node_under_a_running_job_is_named_by_every_other(
    make_cluster: MakeCluster, torch_script: Any
) -> None:
    cluster = start(make_cluster)
    served = {node.name: node.env() for node in cluster}
    jobs = {
        node.name: node.spawn(
            [
                sys.executable,
                str(torch_script),
                "--sidecar",
                f"http://127.0.0.1:{LOCAL_PORT}",
                "--timeout",
                "20",
                "--mib",
                "4",
                "--steps",
                "100000",
            ],
            label="torch",
        )
        for node in cluster
    }
    victim = cluster["sub2"]
    try:
        # Running: every rank is past its first all-reduce.
        wait_for(
            lambda: all("RUNNING rank=" in job.log() for job in jobs.values()),
            timeout_s=60.0, what="every rank's first all-reduce", describe=cluster.logs,
        )  # fmt: skip
        # The node dies: its sidecar and its training process, no goodbye.
        jobs["sub2"].kill()
        victim.kill_sidecar()
        found = wait_named(cluster, "sub2", ["main1", "sub1", "sub3"])
        assert found["main1"]["cause"] == "refused", found
        assert found["main1"]["seen_by"] == "main1"
        assert all(f["seen_by"] == "main1" for f in found.values()), found
        # The job's fate: the survivors' collectives fail on the dead peer.
        for name in ("main1", "sub1", "sub3"):
            try:
                code = jobs[name].wait(60.0)
            except subprocess.TimeoutExpired:
                code = None
            assert code not in (0, None), (name, code, jobs[name].log()[-2000:])
        # The env stays served as it was: the job owns what happens next.
        for name in ("main1", "sub1", "sub3"):
            assert cluster[name].env() == served[name]
    finally:
        for proc in jobs.values():
            proc.kill()
    victim.start_sidecar()
    cluster.wait_all_ready(READY_S)
    wait_cleared(cluster)


def test_a_paused_master_is_named_by_every_worker(make_cluster: MakeCluster) -> None:
    cluster = start(make_cluster)
    master = cluster["main1"]
    assert master.sidecar is not None
    master.sidecar.signal(signal.SIGSTOP)
    try:
        found = wait_named(cluster, "main1", ["sub1", "sub2", "sub3"])
    finally:
        master.sidecar.signal(signal.SIGCONT)
    for name, entry in found.items():
        assert entry["cause"] == "timed_out" and entry["seen_by"] == name, found
    wait_cleared(cluster)
    assert all(node.is_ready() for node in cluster)


def test_a_node_cut_off_is_named_and_names_the_master(make_cluster: MakeCluster) -> None:
    cluster = start(make_cluster)
    cut = cluster["sub3"]
    cut.link_down()
    try:
        found = wait_named(cluster, "sub3", ["main1", "sub1", "sub2"])
        assert found["main1"]["cause"] in ("timed_out", "unreachable"), found
        # The cut-off node's own sidecar (its local API still answers) names the master.
        mine = wait_for(lambda: named(cut, "main1"), timeout_s=NAMED_S, what="sub3 to name main1")
        assert mine["seen_by"] == "sub3", mine
        # An interval or more later, with the link still cut, the verdict has not flipped.
        again = named(cluster["main1"], "sub3")
        assert again is not None and again["cause"] == found["main1"]["cause"], again
    finally:
        cut.link_up()
    wait_cleared(cluster)


def test_the_log_and_status_name_the_dead_node(make_cluster: MakeCluster) -> None:
    cluster = start(make_cluster)
    witness = cluster["sub2"]
    assert witness.sidecar is not None
    cluster["sub1"].kill_sidecar()
    wait_named(cluster, "sub1", ["main1", "sub2"])
    assert "peer_down" in witness.sidecar.log() and "sub1" in witness.sidecar.log()
    shown = witness.run([sys.executable, "-m", "rallypoint", "status"], timeout_s=30.0)
    assert shown.returncode == 0, shown.stderr
    assert "sub1 (rank 1) is down" in shown.stdout, shown.stdout
    cluster["sub1"].start_sidecar()
    wait_cleared(cluster)
    assert "peer_up" in witness.sidecar.log(), witness.sidecar.log()[-2000:]
