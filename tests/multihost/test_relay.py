"""The fan-out tree across namespaces: a member joins through its relay, or around it.

Four hosts in groups of two (--relay-group 2): the master serves rank 1 itself and rank 2
relays for rank 3 (docs/scale.md). Real sidecars, real sockets, a real gloo job.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.multihost import clients
from tests.support.cluster.build import Cluster, MakeCluster, backendai_order
from tests.support.cluster.layout import PEER_PORT
from tests.support.cluster.nodes import Node
from tests.support.netns import xtables

pytestmark = [pytest.mark.multihost]

HOSTS = ("main1", "sub1", "sub2", "sub3")
READY_S = 40.0
JOB_S = 120.0  # four torch imports on two cores


def by_rank(cluster: Cluster) -> list[Node]:
    return [cluster[name] for name in backendai_order(cluster.hosts)]


def peer_requests(node: Node, route: str) -> float:
    text = node.get("/metrics").text
    total = 0.0
    for line in text.splitlines():
        labels = (f'route="{route}"', 'api="peer"', 'status="200"')
        if line.startswith("rallypoint_http_requests_total{") and all(x in line for x in labels):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.torch
def test_a_member_joins_through_its_relay_and_the_job_runs(
    make_cluster: MakeCluster, torch_script: Path
) -> None:
    cluster = make_cluster(hosts=HOSTS, args=("--relay-group", "2"))
    master, _, relay, member = by_rank(cluster)
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    assert len({env["MASTER_PORT"] for env in served.values()}) == 1
    status = relay.status()["relay"]
    assert status["ranks"] == [3, 3] and status["joined"] == 1, status
    assert peer_requests(relay, "/v1/join") >= 1
    assert peer_requests(master, "/v1/joins") >= 1
    assert "relay" not in member.status()
    results = clients.run_torch_job(list(cluster), torch_script, timeout_s=JOB_S)
    for name, (code, result) in results.items():
        assert code == 0 and result is not None, f"{name}: exit {code}, {result}"
        assert result["ok"] and result["world_size"] == 4, result


def test_a_member_cut_off_from_its_relays_peer_api_joins_the_master(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(hosts=HOSTS, args=("--relay-group", "2"))
    master, _, relay, member = by_rank(cluster)
    # The relay's peer API drops the member's connections; every other port stays open.
    relay.inside(
        xtables(
            "iptables",
            "-A",
            "INPUT",
            "-s",
            member.address,
            "-p",
            "tcp",
            "--dport",
            str(PEER_PORT),
            "-j",
            "DROP",
        )
    )
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)
    assert len({env["MASTER_PORT"] for env in served.values()}) == 1
    assert relay.status()["relay"]["joined"] == 0
    # Rank 3 joined the master itself (rank 2 relayed nobody, so it sent no batch).
    assert peer_requests(master, "/v1/join") >= 3
    assert peer_requests(master, "/v1/joins") == 0
    assert member.status()["peers"][0]["joined"]
