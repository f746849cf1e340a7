"""Ready means connected: each network fault's verdict checked against a real gloo job's fate.

Three namespace hosts on 198.18.213.0/24 (above 127, like Docker's 172.17), Backend.AI order
(``main1`` listed second), token on. For every scenario the sidecars give their verdict
first; then the sidecars are stopped (their probe windows would otherwise listen on the
ports) and a torch gloo all-reduce runs on the same hosts with the env the sidecars serve
(or, when they refuse to, the same env built by hand from /status), under the same fault
(tests/multihost/jobs.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.jobs import FAILING_JOB_S, job_completed, rank_of, run_job, wait_reason
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.nodes import Node
from tests.support.netns import IFNAME, xtables

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

SUBNET = "198.18.213"
#: Preferred master port: known before the sidecars start, so a firewall can drop it.
MASTER_PORT = 29511
READY_S = 40.0
#: Probes give up per attempt after this; failures are retried until repaired.
ARGS = ("--probe-timeout", "1", "--frameworks", "torch,tf")


@pytest.fixture
def cluster(make_cluster: MakeCluster) -> Cluster:
    return make_cluster(args=ARGS, env={"RALLYPOINT_MASTER_PORT": str(MASTER_PORT)}, subnet=SUBNET)


def test_clean_cluster_is_ready_and_the_job_completes(cluster: Cluster, torch_script: Path) -> None:
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    for name, env in served.items():
        assert env["GLOO_SOCKET_IFNAME"] == IFNAME, name  # served by default
        assert "NCCL_SOCKET_IFNAME" not in env
        checks = cluster[name].status()["checks"]
        assert checks["verdict"]["verified"] and set(checks["windows"].values()) == {"closed"}
        network = cluster[name].status()["network"]
        assert network["route_ifname"] == IFNAME and network["mtu"] == 1500
    results = run_job(cluster, torch_script, {n: dict(e) for n, e in served.items()})
    assert job_completed(results), results


def test_a_cut_worker_pair_is_not_ready_everywhere_and_the_job_fails(
    cluster: Cluster, torch_script: Path
) -> None:
    sub1, sub2 = cluster["sub1"], cluster["sub2"]
    sub1.blackhole(sub2.address)
    sub2.blackhole(sub1.address)
    cluster.start_all()
    for node in cluster:
        reason = wait_reason(node, "peer_unreachable")
        assert {"sub1", "sub2"} <= {*reason["message"].split()[:5], reason["host"]}, reason
        assert reason["detail"] in {"timeout", "no_route", "error"}, reason
    assert not any(node.is_ready() for node in cluster)
    # The mesh, asked on a worker (which fetches the master's view): the cut pair both ways,
    # every other pair passed.
    ranks = {node.name: rank_of(cluster, node.name) for node in cluster}
    mesh = wait_mesh(cluster["sub1"], failed=2)
    cut = {(ranks["sub1"], ranks["sub2"]), (ranks["sub2"], ranks["sub1"])}
    for a, row in enumerate(mesh["matrix"]):
        for b, mark in enumerate(row):
            want = "\\" if a == b else ("T", "N", "E") if (a, b) in cut else (".",)
            assert mark in want, (a, b, mark, mesh["matrix"])
    text = cluster["sub2"].run([sys.executable, "-m", "rallypoint", "status", "--mesh"])
    assert text.returncode == 1, text
    assert "4 passed, 2 failed" in text.stdout, text.stdout
    results = run_job(cluster, torch_script, wait_s=FAILING_JOB_S)
    assert not job_completed(results), results


def wait_mesh(node: Node, *, failed: int, timeout_s: float = READY_S) -> dict[str, Any]:
    """GET /mesh on ``node`` until every node reported and ``failed`` pairs failed."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = node.try_get("/mesh")
        mesh = reply.json() if reply is not None and reply.status == 200 else None
        if mesh and mesh["reported"] == mesh["nnodes"] and mesh["counts"]["failed"] == failed:
            return dict(mesh)
        assert time.monotonic() < deadline, mesh
        time.sleep(0.2)


def test_the_master_port_dropped_by_a_firewall_is_not_ready(
    cluster: Cluster, torch_script: Path
) -> None:
    main1 = cluster["main1"]
    main1.inside(
        xtables("iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(MASTER_PORT), "-j", "DROP")
    )
    cluster.start_all()
    for name in ("sub1", "sub2"):
        reason = wait_reason(cluster[name], "master_port_unreachable")
        assert f"tcp/{MASTER_PORT}" in reason["message"] and reason["detail"] == "timeout"
    reason = wait_reason(main1, "master_port_unreachable")  # the master names it too
    assert not any(node.is_ready() for node in cluster)
    results = run_job(cluster, torch_script, wait_s=FAILING_JOB_S)
    assert not job_completed(results), results


def test_traffic_that_flows_one_way_is_not_ready(cluster: Cluster, torch_script: Path) -> None:
    # sub2 cannot open connections to sub1; sub1 can to sub2. gloo's pair sub1/sub2 is
    # dialled by the node with the larger address (sub2), so the job fails.
    sub1, sub2 = cluster["sub1"], cluster["sub2"]
    sub1.inside(
        xtables("iptables", "-A", "INPUT", "-s", sub2.address, "-p", "tcp", "--syn", "-j", "DROP")
    )
    cluster.start_all()
    reason = wait_reason(cluster["main1"], "peer_unreachable")
    assert reason["message"].startswith("sub2 cannot reach sub1"), reason
    assert reason["ranks"] == [rank_of(cluster, "sub2"), rank_of(cluster, "sub1")]
    assert not any("sub1 cannot reach sub2" in str(r) for r in sub1.not_ready_reasons() or [])
    results = run_job(cluster, torch_script, wait_s=FAILING_JOB_S)
    assert not job_completed(results), results


def test_a_dropped_tf_port_is_not_ready_only_when_tf_config_is_served(
    make_cluster: MakeCluster, torch_script: Path
) -> None:
    tf_port = 2299
    with_tf = make_cluster(
        args=(*ARGS, "--tf-port", str(tf_port)),
        env={"RALLYPOINT_MASTER_PORT": str(MASTER_PORT)},
        subnet=SUBNET,
    )
    with_tf["sub2"].inside(
        xtables("iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(tf_port), "-j", "DROP")
    )
    with_tf.start_all()
    reason = wait_reason(with_tf["sub1"], "tf_port_unreachable")
    assert f"sub2 ({with_tf['sub2'].address}) on tcp/{tf_port}" in reason["message"], reason
    assert not any(node.is_ready() for node in with_tf)
    for node in with_tf:
        if node.sidecar is not None:
            node.sidecar.stop()
    # The same fault where only torch's variables are served: the TF port is no connection
    # the job makes, so the cluster is ready, and the gloo job completes.
    torch_only = make_cluster(
        args=("--probe-timeout", "1", "--frameworks", "torch", "--tf-port", str(tf_port)),
        env={"RALLYPOINT_MASTER_PORT": str(MASTER_PORT)},
        subnet="198.18.214",
    )
    torch_only["sub2"].inside(
        xtables("iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(tf_port), "-j", "DROP")
    )
    torch_only.start_all()
    served = torch_only.wait_all_ready(READY_S)
    results = run_job(torch_only, torch_script, served)
    assert job_completed(results), results


def test_an_mtu_mismatch_is_a_warning_and_the_job_completes(
    cluster: Cluster, torch_script: Path
) -> None:
    cluster["sub2"].inside(["ip", "link", "set", IFNAME, "mtu", "1400"])
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    for node in cluster:
        warnings = " ".join(node.status()["warnings"])
        assert "MTU" in warnings and "1400 on sub2" in warnings and "1500 on" in warnings, warnings
    assert cluster["sub2"].status()["network"]["mtu"] == 1400
    results = run_job(cluster, torch_script, served)
    assert job_completed(results), results


def test_a_fault_repaired_while_waiting_turns_ready_without_a_restart(
    cluster: Cluster, torch_script: Path
) -> None:
    sub1, sub2 = cluster["sub1"], cluster["sub2"]
    sub1.blackhole(sub2.address)
    cluster.start_all()
    wait_reason(cluster["main1"], "peer_unreachable")
    pids = {node.name: node.sidecar.pid for node in cluster if node.sidecar is not None}
    sub1.unblackhole(sub2.address)
    served = cluster.wait_all_ready(READY_S)
    assert {n.name: n.sidecar.pid for n in cluster if n.sidecar is not None} == pids
    results = run_job(cluster, torch_script, served)
    assert job_completed(results), results
