"""Scenario 9: a rogue mDNS announcer on the bridge is ignored and counted."""

from __future__ import annotations

import sys

import pytest

from tests.multihost.conftest import TOKEN, MakeCluster
from tests.support.cluster.build import mdns_cluster
from tests.support.netns import IFNAME, wait_for

pytestmark = pytest.mark.multihost

READY_S = 60.0

# Two announcers on the rogue's host: one of another session (signed with the right
# token), one of the cluster's session signed with the wrong token. Both keep announcing
# until the test kills them.
ROGUE_SCRIPT = """
import asyncio, sys
from rallypoint.auth import Authenticator
from rallypoint.mdns.announce import Mdns

session, token, ifname, address = sys.argv[1:5]

async def main():
    other = Mdns(session=session + "-other", host="rogue", peer_port=7781,
                 auth=Authenticator(token), interfaces=[ifname])
    forged = Mdns(session=session, host="rogue", peer_port=7781,
                  auth=Authenticator("not-" + token), interfaces=[ifname])
    async with other, forged:
        for mdns in (other, forged):
            await mdns.announce(rank=-1, generation="", addresses=[address])
        print("announced", flush=True)
        await asyncio.Event().wait()

asyncio.run(main())
"""


def test_a_rogue_announcer_is_ignored_and_counted(make_cluster: MakeCluster) -> None:
    members = ("alpha", "mike", "zulu")
    cluster = mdns_cluster(make_cluster, (*members, "rogue"), len(members))
    rogue = cluster["rogue"]
    argv = [sys.executable, "-c", ROGUE_SCRIPT, cluster.session, TOKEN, IFNAME]
    proc = rogue.spawn([*argv, rogue.address], label="rogue")
    wait_for(lambda: "announced" in proc.log(), timeout_s=30, what="the rogue announcing")

    for name in members:
        cluster[name].start_sidecar()
    envs = {name: cluster[name].wait_ready(READY_S) for name in members}
    assert {env["MASTER_ADDR"] for env in envs.values()} == {"alpha"}
    assert sorted(env["NODE_RANK"] for env in envs.values()) == ["0", "1", "2"]
    assert proc.alive(), proc.log()

    for name in members:
        node = cluster[name]
        status = node.status()
        assert "rogue" not in [peer["host"] for peer in status["peers"]]
        assert "rogue" not in status["spec"]["hosts"]
        assert "rogue" not in [seen["host"] for seen in status["mdns"]["seen"]]
        rejected = status["mdns"]["rejections"]
        assert rejected.get("session", 0) >= 1 and rejected.get("signature", 0) >= 1, status
        metrics = node.get("/metrics").text
        assert 'rallypoint_mdns_rejected_total{reason="session"}' in metrics
        assert 'rallypoint_mdns_rejected_total{reason="signature"}' in metrics
