"""Ready means the job runs at speed: data-path faults, each verdict against a real job's fate.

Three namespace hosts on 198.18.215.0/24, Backend.AI order (``main1`` listed second), token
on. Each fault is on ``sub2``'s link (tests/support/cluster/: a tc filter that drops frames
over a size with offloads off, a tbf shaper, random loss, a shifted clock); after the
sidecars' verdict a torch gloo job all-reduces training-sized tensors (4 MiB of float32,
five steps) on the same hosts under the same fault (tests/multihost/jobs.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.multihost.jobs import FAILING_JOB_S, job_completed, run_job, wait_reason
from tests.support.cluster.build import Cluster, MakeCluster
from tests.support.cluster.nodes import Node

pytestmark = [pytest.mark.multihost, pytest.mark.torch]

SUBNET = "198.18.215"
MASTER_PORT = 29512
READY_S = 60.0
ARGS = ("--probe-timeout", "1", "--frameworks", "torch")
#: Training-sized: 4 MiB of float32 all-reduced five times.
JOB = ("--mib", "4", "--steps", "5")
#: IP packets above this vanish on sub2's link (every interface still says 1500).
CLAMP = 1400


@pytest.fixture
def cluster(make_cluster: MakeCluster) -> Cluster:
    return make_cluster(args=ARGS, env={"RALLYPOINT_MASTER_PORT": str(MASTER_PORT)}, subnet=SUBNET)


def master_view(cluster: Cluster) -> dict[str, Any]:
    return cluster["main1"].status()


def data_path_warnings(node: Node) -> list[str]:
    pattern = re.compile(r"slow|retransmit|path MTU|RDMA|clock", re.I)
    return [w for w in node.status()["warnings"] if pattern.search(w)]


@pytest.mark.quiet_machine  # a clean cluster's links measure clean only on an unstarved host
def test_a_clean_cluster_measures_every_link_without_a_warning(
    cluster: Cluster, torch_script: Path
) -> None:
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    view = master_view(cluster)
    pairs = {frozenset((link["from"], link["to"])) for link in view["links"]}
    assert pairs == {frozenset(p) for p in (("main1", "sub1"), ("main1", "sub2"), ("sub1", "sub2"))}
    for link in view["links"]:
        assert link["complete"] and link["bytes"] == 1 << 20, link
        assert link["up_mbps"] > 0 and link["down_mbps"] > 0 and link["warnings"] == [], link
    assert view["link_warnings"] == []
    for node in cluster:
        assert data_path_warnings(node) == [], node.name
        assert (
            len(node.status()["checks"]["links"]) == {"main1": 2, "sub1": 1, "sub2": 0}[node.name]
        )
    results = run_job(cluster, torch_script, served, args=JOB)
    assert job_completed(results), results


def test_a_path_mtu_black_hole_is_not_ready_and_the_job_hangs(
    cluster: Cluster, torch_script: Path
) -> None:
    cluster["sub2"].clamp_path_mtu(CLAMP)
    cluster.start_all()
    seen = {node.name: wait_reason(node, "path_mtu") for node in cluster}
    for name, reason in seen.items():
        assert "sub2" in [*reason["message"].split()[3:7], reason["host"]], (name, reason)
        # The size that passes is found, and named: packets of CLAMP bytes, not 1500.
        assert CLAMP - 60 <= int(reason["detail"]) <= CLAMP, (name, reason)
        assert f"set the interface MTU to {reason['detail']} on every node" in reason["message"]
    assert not any(node.is_ready() for node in cluster)
    results = run_job(cluster, torch_script, args=JOB, wait_s=FAILING_JOB_S)
    assert not job_completed(results), results


def test_a_shaped_link_is_ready_with_the_slow_node_named_and_the_job_completes(
    cluster: Cluster, torch_script: Path
) -> None:
    cluster["sub2"].shape(10)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    for node in cluster:
        named = [w for w in node.status()["warnings"] if "every measured link of sub2" in w]
        assert named and "is slow" in named[0], (node.name, node.status()["warnings"])
    warnings = master_view(cluster)["link_warnings"]
    # A shaper also drops what overflows its queue: a lossy_link warning may come with it,
    # for sub2 or for one of its links (named by its other end). Every warning is sub2's.
    assert ("slow_link", "sub2", "node") in {(w["code"], w["host"], w["detail"]) for w in warnings}
    assert all(w["host"] == "sub2" or "sub2" in w["message"] for w in warnings), warnings
    results = run_job(cluster, torch_script, served, args=("--mib", "2", "--steps", "3"))
    assert job_completed(results), results


def test_a_lossy_link_is_ready_with_the_lossy_node_named_and_the_job_completes(
    cluster: Cluster, torch_script: Path
) -> None:
    cluster["sub2"].drop_incoming(0.1)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    warnings = master_view(cluster)["link_warnings"]
    lossy = [w for w in warnings if w["code"] == "lossy_link"]
    assert [w["host"] for w in lossy] == ["sub2"], warnings
    assert "every measured link of sub2 retransmits" in lossy[0]["message"]
    for node in cluster:
        assert any("sub2 retransmits" in w for w in node.status()["warnings"]), node.name
    results = run_job(cluster, torch_script, served, args=JOB)
    assert job_completed(results), results


def test_a_skewed_clock_is_ready_with_the_offset_named_and_the_job_completes(
    cluster: Cluster, torch_script: Path
) -> None:
    for node in cluster:
        node.start_sidecar(clock_offset_s=600 if node.name == "sub2" else None)
    served = cluster.wait_all_ready(READY_S)
    for node in cluster:
        named = [w for w in node.status()["warnings"] if w.startswith("sub2's clock is")]
        assert named, (node.name, node.status()["warnings"])
        offset = float(named[0].split()[3])
        assert 595 <= offset <= 605 and "ahead of the master's" in named[0], named
        assert not any(
            w.startswith(("main1's clock", "sub1's clock")) for w in data_path_warnings(node)
        )
    nodes = {n["host"]: n for n in master_view(cluster)["cluster"]}
    assert 595 <= nodes["sub2"]["clock_offset_s"] <= 605, nodes
    results = run_job(cluster, torch_script, served, args=JOB, clock_offsets={"sub2": 600})
    assert job_completed(results), results
