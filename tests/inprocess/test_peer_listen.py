"""The peer API's wildcard address listens on IPv4 and IPv6; a specific address alone."""

from __future__ import annotations

import socket

import aiohttp

from rallypoint.model import ClusterSpec
from rallypoint.sidecar import Sidecar
from tests.conftest import require
from tests.fakes import FakeResolver
from tests.support.cluster.inprocess import SESSION
from tests.support.ports import free_port
from tests.support.settings import fast_settings


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


async def ready_answer(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url) as resp:
        return resp.status


async def test_the_wildcard_peer_address_also_listens_on_ipv6() -> None:
    require(ipv6_loopback(), "IPv6 is not available on loopback")
    peer_port = free_port()
    settings = fast_settings(local_port=free_port(), peer_port=peer_port, peer_host="0.0.0.0")
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    async with Sidecar(settings, {}, resolver=FakeResolver(), spec=spec) as sidecar:
        assert sidecar.listeners is not None
        assert sidecar.listeners.peer_bound == [("0.0.0.0", peer_port), ("::", peer_port)]
        # /v1/ready needs no signature without a token: any answer proves the listener.
        assert await ready_answer(f"http://[::1]:{peer_port}/v1/ready") == 200
        assert await ready_answer(f"http://127.0.0.1:{peer_port}/v1/ready") == 200


async def test_a_specific_peer_address_is_the_only_one() -> None:
    peer_port = free_port()
    settings = fast_settings(local_port=free_port(), peer_port=peer_port, peer_host="127.0.0.1")
    spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
    async with Sidecar(settings, {}, resolver=FakeResolver(), spec=spec) as sidecar:
        assert sidecar.listeners is not None
        assert sidecar.listeners.peer_bound == [("127.0.0.1", peer_port)]


async def test_the_peer_client_drops_an_idle_connection_before_any_peer_api_would() -> None:
    # A pooled connection reused as the peer closes it at its keep-alive timeout fails with
    # ServerDisconnectedError: the client's own idle bound must come first.
    from rallypoint import server
    from rallypoint.auth import Authenticator
    from rallypoint.net import peerhttp

    assert peerhttp.IDLE_S < server.KEEPALIVE_S <= server.peer_keepalive_s(1)
    client = peerhttp.PeerClient(Authenticator(None), exchange_s=1.0, long_poll_s=1.0)
    client.open()
    try:
        connector = client._client().connector
        assert connector is not None and connector._keepalive_timeout == peerhttp.IDLE_S
    finally:
        await client.close()
