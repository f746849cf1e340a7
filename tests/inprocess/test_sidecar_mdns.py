"""Sidecars with mDNS on loopback multicast: discovery without a host list, and the fast path.

Names resolve through each node's FakeResolver to documentation addresses; the endpoint seam
sends peer traffic to that host's own port on 127.0.0.1 (as in test_rendezvous.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest

from rallypoint import providers
from rallypoint.auth import Authenticator
from rallypoint.errors import ClusterSpecError
from rallypoint.mdns.announce import Mdns
from rallypoint.model import ClusterSpec
from rallypoint.sidecar import Sidecar
from tests.fakes import FakeResolver
from tests.support.mdns import LOOPBACK
from tests.support.ports import free_port
from tests.support.settings import fast_settings

WAIT_S = 30.0
TOKEN = "mdns-secret"


def address(host: str) -> str:
    return f"198.51.100.{sum(host.encode()) % 200 + 20}"


@dataclass
class Nodes:
    """Sidecars found by mDNS: each node's name resolves everywhere; peers use their own ports."""

    session: str
    hosts: tuple[str, ...]
    stack: AsyncExitStack
    peer_ports: dict[str, int] = field(default_factory=dict)
    local_ports: dict[str, int] = field(default_factory=dict)
    sidecars: dict[str, Sidecar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.peer_ports = {h: free_port() for h in self.hosts}
        self.local_ports = {h: free_port() for h in self.hosts}

    def endpoint(self, host: str, _address: str) -> tuple[str, int]:
        return "127.0.0.1", self.peer_ports[host]

    async def start(
        self,
        host: str,
        nnodes: int,
        *,
        spec: ClusterSpec | None = None,
        unknown: tuple[str, ...] = (),
        **changes: Any,
    ) -> Sidecar:
        environ = {
            "RALLYPOINT_DISCOVERY": "mdns",
            "RALLYPOINT_NNODES": str(nnodes),
            "RALLYPOINT_SESSION": self.session,
            "HOSTNAME": host,
        }
        settings = fast_settings(
            local_port=self.local_ports[host],
            peer_port=self.peer_ports[host],
            mdns=True,
            mdns_interfaces=tuple(LOOPBACK),
            token=TOKEN,
            deadline_s=WAIT_S,
            **changes,
        )
        resolver = FakeResolver({h: [address(h)] for h in self.hosts if h not in unknown})
        sidecar = Sidecar(
            settings,
            environ,
            resolver=resolver,
            spec=spec or providers.detect(environ),
            addresses=[address(host)],
            endpoint=self.endpoint,
            # Probes keep their port but go to loopback, where every node holds its own.
            route=lambda _host, _address, port: ("127.0.0.1", port),
        )
        self.sidecars[host] = await self.stack.enter_async_context(sidecar)
        return sidecar

    async def get(self, host: str, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.local_ports[host]}{path}"
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            return resp.status, await resp.text()


@pytest.fixture
async def nodes(multicast_lo: None, session: str) -> AsyncIterator[Callable[..., Nodes]]:
    async with AsyncExitStack() as stack:

        def make(*hosts: str) -> Nodes:
            return Nodes(session, hosts, stack)

        yield make


async def until(
    predicate: Callable[[], bool], what: str, explain: Callable[[], object] = lambda: ""
) -> None:
    """Poll ``predicate``; fail naming ``what`` after WAIT_S (a deadline, not a speed test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + WAIT_S
    while not predicate():
        if loop.time() > end:
            pytest.fail(f"timed out waiting for {what}: {explain()}")
        await asyncio.sleep(0.05)


async def test_discovery_serves_the_local_api_from_the_start_and_converges(
    nodes: Callable[..., Nodes], session: str
) -> None:
    cluster = nodes("mike", "alpha", "zulu")
    first = await cluster.start("mike", 3)
    # Only one of three nodes is up: the APIs answer and say why the node is not ready.
    assert await cluster.get("mike", "/livez") == (200, "ok\n")
    status, text = await cluster.get("mike", "/readyz")
    assert status == 503 and text.startswith("not ready: discovering:"), text
    assert "of 3 nodes" in text
    status, text = await cluster.get("mike", "/status")
    body = json.loads(text)
    assert status == 200 and body["role"] == "discovering" and body["spec"]["hosts"] == []
    assert "seen" in body["mdns"]

    def seen() -> list[str]:
        return [a["host"] for a in first.node.status()["mdns"]["seen"]]  # type: ignore[index]

    await until(lambda: seen() == ["mike"], "the node's own announcement")
    await until(lambda: first.node.readiness.reasons()[0].detail == "1/3", "the discovery count")

    # Another session announcing on the same LAN is ignored, not counted as a node.
    other = Mdns(
        session=f"{session}-other",
        host="oscar",
        peer_port=7781,
        auth=Authenticator(TOKEN),
        interfaces=LOOPBACK,
    )
    async with other:
        await other.announce(rank=-1, generation="", addresses=["198.51.100.99"])
        await cluster.start("zulu", 3)
        await cluster.start("alpha", 3)
        sidecars = cluster.sidecars
        results = await asyncio.gather(
            *(s.node.readiness.wait_ready(WAIT_S) for s in sidecars.values())
        )
        assert all(results), {h: s.node.status()["reasons"] for h, s in sidecars.items()}
        await until(
            lambda: first.metrics.value("rallypoint_mdns_rejected_total", reason="session") > 0,
            "the other session's rejection",
        )

    served = {host: s.node.readiness.env for host, s in sidecars.items()}
    envs = {host: env.as_dict() for host, env in served.items() if env}
    assert {env["MASTER_ADDR"] for env in envs.values()} == {"alpha"}
    master_port = sidecars["alpha"].node.held["master"].port
    assert {env["MASTER_PORT"] for env in envs.values()} == {str(master_port)}
    assert {host: env["NODE_RANK"] for host, env in envs.items()} == {
        "alpha": "0",
        "mike": "1",
        "zulu": "2",
    }
    for sidecar in sidecars.values():
        assert "oscar" not in sidecar.node.spec.hosts
        assert sidecar.node.status()["role"] in ("master", "worker")


async def test_more_announcers_than_nnodes_is_a_clear_reason(
    nodes: Callable[..., Nodes], session: str
) -> None:
    cluster = nodes("alpha", "bravo", "charlie")
    async with AsyncExitStack() as extra:
        announcers: dict[str, Mdns] = {}
        for host in ("bravo", "charlie"):
            mdns = Mdns(
                session=session,
                host=host,
                peer_port=7781,
                auth=Authenticator(TOKEN),
                interfaces=LOOPBACK,
            )
            announcers[host] = await extra.enter_async_context(mdns)
            await mdns.announce(rank=-1, generation="", addresses=[address(host)])
        alpha = await cluster.start("alpha", 2)
        await until(
            lambda: [r.code for r in alpha.node.readiness.reasons()][:1] == ["discovery_conflict"],
            "the conflict reason",
            lambda: (alpha.node.readiness.reasons(), alpha.node.status().get("mdns")),
        )
        status, text = await cluster.get("alpha", "/readyz")
        assert status == 503
        assert "mDNS sees 3 hosts" in text and "RALLYPOINT_NNODES=2" in text, text
        # The peer API is up, but refuses joins until the ranks are known.
        url = f"http://127.0.0.1:{cluster.peer_ports['alpha']}/v1/join"
        body = json.dumps(
            {"session": session, "rank": 1, "host": "bravo", "addresses": [], "tf_port": None}
        ).encode()
        headers = {"Content-Type": "application/json"}
        headers.update(Authenticator(TOKEN).sign("POST /v1/join", body))
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
            assert r.status == 503 and (await r.json())["code"] == "discovering"
        assert not alpha.node.spec_known
        # charlie says goodbye: two hosts remain and the ranks follow.
        await announcers["charlie"].close()
        await until(lambda: alpha.node.spec_known, "discovery to complete once charlie left")
        assert alpha.node.spec.hosts == ("alpha", "bravo")


async def test_the_masters_announcement_wakes_a_worker_out_of_its_backoff(
    nodes: Callable[..., Nodes], session: str
) -> None:
    """The master cannot poke the worker (it cannot resolve its name): mDNS must wake it."""
    cluster = nodes("node0", "node1")
    hosts = ("node0", "node1")
    slow: dict[str, Any] = {"backoff_initial_s": 3600.0, "backoff_max_s": 3600.0}
    worker = await cluster.start(
        "node1", 2, spec=ClusterSpec("explicit", hosts, 1, 2, session), **slow
    )
    await until(
        lambda: (
            worker.metrics.value("rallypoint_join_attempts_total", result="master_unreachable") >= 1
        ),
        "the worker's first failed join",
    )
    master_spec = ClusterSpec("explicit", hosts, 0, 2, session)
    master = await cluster.start("node0", 2, spec=master_spec, unknown=("node1",))
    await until(lambda: master.node.peers[1].joined, "the worker's join")
    assert master.metrics.value("rallypoint_pokes_sent_total", result="accepted") == 0
    assert worker.metrics.value("rallypoint_mdns_wakeups_total") >= 1


def _unusable_mdns(hostname: str, discovery: bool) -> Sidecar:
    """A sidecar whose mDNS cannot start (its only interface does not exist)."""
    environ = {"HOSTNAME": hostname, "RALLYPOINT_SESSION": "no-multicast"}
    if discovery:
        environ |= {"RALLYPOINT_DISCOVERY": "mdns", "RALLYPOINT_NNODES": "2"}
    settings = fast_settings(
        local_port=free_port(),
        peer_port=free_port(),
        mdns=True,
        mdns_interfaces=("rp-no-such-if0",),
    )
    return Sidecar(settings, environ, resolver=FakeResolver({hostname: [address(hostname)]}))


async def test_without_a_host_list_unavailable_mdns_fails_the_start_before_listening() -> None:
    sidecar = _unusable_mdns("node-a", discovery=True)
    with pytest.raises(ClusterSpecError, match="mDNS is unavailable"):
        await sidecar.start()
    assert sidecar.listeners is None
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(f"http://127.0.0.1:{sidecar.settings.local_port}/livez")


async def test_with_a_host_list_unavailable_mdns_leaves_http_serving() -> None:
    sidecar = _unusable_mdns("node-a", discovery=False)
    async with sidecar:
        url = f"http://127.0.0.1:{sidecar.settings.local_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/livez") as resp:
                assert resp.status == 200
            async with http.get(f"{url}/status") as resp:
                mdns = (await resp.json())["mdns"]
        assert mdns["enabled"] is True
        assert mdns["available"] is False
