"""Real mDNS across namespaces on a bridge: nodes agree on ranks, a rogue announcer is refused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rallypoint.mdns import txt
from tests.support import netns
from tests.support.cluster.build import MakeCluster
from tests.support.cluster.nodes import Node
from tests.support.netns import IFNAME

pytestmark = pytest.mark.multihost

# Each node announces on its bridge interface until it has seen the whole session
# (or gives up), lingers so the slower nodes see it too, then prints what it saw.
NODE_SCRIPT = """
import asyncio, json, sys
from rallypoint.auth import Authenticator
from rallypoint.mdns.announce import Mdns
from rallypoint.mdns.ranks import assign_ranks

session, host, token, nnodes, ifname, address = sys.argv[1:7]

async def main():
    async with Mdns(session=session, host=host, peer_port=7781, auth=Authenticator(token),
                    interfaces=[ifname]) as mdns:
        await mdns.announce(rank=-1, generation="", addresses=[address])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        order = None
        while order is None and loop.time() < deadline:
            await asyncio.sleep(0.1)
            order = assign_ranks(mdns.peers(), int(nnodes))
        await asyncio.sleep(3)
        print(json.dumps({"order": order, "status": mdns.status()}))

asyncio.run(main())
"""


def test_nodes_agree_on_ranks_and_refuse_a_rogue(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(hosts=("zulu", "alpha", "mike", "rogue"))
    token = "mdns-netns-secret"

    def argv(node: Node) -> list[str]:
        secret = "wrong-secret" if node.name == "rogue" else token
        args = [cluster.session, node.name, secret, "3", IFNAME, node.address]
        return [sys.executable, "-c", NODE_SCRIPT, *args]

    procs = {node.name: node.spawn(argv(node), label="mdns") for node in cluster}
    rogue = txt.instance_name(cluster.session, "rogue")
    results = {}
    for name, proc in procs.items():
        try:
            code = proc.wait(timeout_s=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"{name}'s mDNS node did not finish:\n{proc.log()}")
        assert code == 0, f"{name} failed:\n{proc.log()}"
        results[name] = json.loads(proc.log().strip().splitlines()[-1])
    for name in ("zulu", "alpha", "mike"):
        status = results[name]["status"]
        assert results[name]["order"] == ["alpha", "mike", "zulu"], status
        assert status["seen_any"] is True
        assert [rogue, "signature"] in status["recent_rejections"], status
    assert results["rogue"]["order"] is None


def test_the_host_has_no_address_on_the_bridge_so_no_host_announcer_reaches_the_nodes(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(hosts=("zulu", "alpha"))
    ports = [cluster.bridge.name, *(node.veth for node in cluster)]
    assert {port: netns.host_addresses(port) for port in ports} == {port: [] for port in ports}
    # The nodes themselves still have theirs, link-local included (mDNS over IPv6 needs it).
    first = next(iter(cluster))
    inside = netns.sh(["ip", "-n", first.ns, "-6", "addr", "show", "dev", IFNAME])
    assert "fe80::" in inside.stdout
