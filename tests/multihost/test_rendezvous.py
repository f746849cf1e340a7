"""A healthy three-node Backend.AI cluster: one agreed env, and listeners where they belong."""

from __future__ import annotations

import json

import pytest

from tests.support.cluster.build import Cluster, backendai_order
from tests.support.cluster.layout import LOCAL_PORT, PEER_PORT

pytestmark = pytest.mark.multihost

READY_S = 30.0


def test_every_node_serves_the_same_cluster_with_its_own_rank(cluster: Cluster) -> None:
    cluster.start_all()
    served = cluster.wait_all_ready(READY_S)

    expected_order = backendai_order(cluster.hosts)
    assert expected_order[0] == "main1" and cluster.hosts[0] != "main1"
    shared = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NNODES", "RALLYPOINT_GENERATION")
    for key in shared:
        values = {name: env.get(key) for name, env in served.items()}
        assert len(set(values.values())) == 1 and None not in values.values(), (key, values)
    some = served["main1"]
    assert some["MASTER_ADDR"] == "main1"  # the main container, though listed second
    assert some["WORLD_SIZE"] == some["NNODES"] == "3"
    assert 1 <= int(some["MASTER_PORT"]) <= 65535

    tf_clusters = {name: json.loads(env["TF_CONFIG"])["cluster"] for name, env in served.items()}
    assert len({json.dumps(c, sort_keys=True) for c in tf_clusters.values()}) == 1, tf_clusters
    workers = tf_clusters["main1"]["worker"]
    assert [address.rsplit(":", 1)[0] for address in workers] == expected_order

    for name, env in served.items():
        rank = expected_order.index(name)
        assert env["RANK"] == env["NODE_RANK"] == str(rank), (name, env)
        task = json.loads(env["TF_CONFIG"])["task"]
        assert task == {"type": "worker", "index": rank}, (name, task)
        status = cluster[name].status()
        assert status["ready"] is True
        assert status["generation"] == env["RALLYPOINT_GENERATION"]
    assert sorted(env["RANK"] for env in served.values()) == ["0", "1", "2"]


def test_local_api_stays_inside_its_namespace_while_peer_api_is_reachable(
    cluster: Cluster,
) -> None:
    cluster.start_all()
    cluster.wait_all_ready(READY_S)

    for client in cluster:
        # Positive control: the same probe reaches the node's own local API.
        assert client.connect("127.0.0.1", LOCAL_PORT) is None
        for server in cluster:
            if server is client:
                continue
            local = client.connect(server.address, LOCAL_PORT)
            peer = client.connect(server.address, PEER_PORT)
            assert local is not None, f"{client.name} reached {server.name}'s local API"
            assert peer is None, f"{client.name} cannot reach {server.name}'s peer API: {peer}"
