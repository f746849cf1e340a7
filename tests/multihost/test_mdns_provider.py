"""Scenario 3: the mdns provider (no host list) converges across namespaces on a bridge."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.cluster.build import MakeCluster, mdns_cluster
from tests.support.netns import wait_for

pytestmark = pytest.mark.multihost

HOSTS = ("zulu", "alpha", "mike")
READY_S = 60.0


def test_mdns_provider_converges_to_one_env(make_cluster: MakeCluster) -> None:
    cluster = mdns_cluster(make_cluster, HOSTS, len(HOSTS))
    first = cluster["zulu"]
    first.start_sidecar()
    # Alone, zulu already answers: alive, not ready, and says how far discovery got.
    reply = wait_for(first.readyz, timeout_s=30, what="zulu's /readyz")
    assert reply.status == 503 and "discovering" in reply.text, reply.text
    assert first.get("/livez").status == 200
    status: dict[str, Any] = first.status()
    assert status["role"] == "discovering" and status["spec"]["hosts"] == []

    cluster["alpha"].start_sidecar()
    cluster["mike"].start_sidecar()
    envs = cluster.wait_all_ready(READY_S)
    assert {env["MASTER_ADDR"] for env in envs.values()} == {"alpha"}
    assert len({env["MASTER_PORT"] for env in envs.values()}) == 1
    ranks = {name: env["NODE_RANK"] for name, env in envs.items()}
    assert ranks == {"alpha": "0", "mike": "1", "zulu": "2"}
    assert {env["WORLD_SIZE"] for env in envs.values()} == {"3"}
    for node in cluster:
        status = node.status()
        assert status["spec"]["provider"] == "mdns"
        assert status["spec"]["hosts"] == ["alpha", "mike", "zulu"]
        assert status["mdns"]["available"] is True
