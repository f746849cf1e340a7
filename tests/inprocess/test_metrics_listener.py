"""The metrics listener (--metrics-port): /metrics and nothing else, off unless asked."""

from __future__ import annotations

import aiohttp
import pytest

from rallypoint.errors import PortError
from rallypoint.metrics import content_type
from rallypoint.settings import Settings
from rallypoint.sidecar import Sidecar
from tests.support.ports import free_port
from tests.support.settings import fast_settings

TOKEN = "metrics-listener-secret"


def _settings(**changes: object) -> Settings:
    return fast_settings(local_port=free_port(), peer_port=free_port(), token=TOKEN, **changes)


async def test_it_serves_the_exposition_and_nothing_else() -> None:
    port = free_port()
    settings = fast_settings(
        local_port=free_port(), peer_port=free_port(), token=TOKEN,
        metrics_port=port, metrics_host="127.0.0.1",
    )  # fmt: skip
    async with Sidecar(settings, {}) as sidecar:
        assert await sidecar.node.readiness.wait_ready(20)
        assert sidecar.listeners is not None
        assert sidecar.listeners.metrics_bound == [("127.0.0.1", port)]
        env = sidecar.node.readiness.env
        assert env is not None
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"] == content_type()
                body = await resp.read()
            async with http.head(f"{base}/metrics") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/metrics") as resp:
                counted = await resp.read()  # the first scrape counts once it is answered
            for path in ("/env", "/status", "/job", "/mesh", "/livez", "/v1/ready", "/"):
                async with http.get(base + path) as resp:
                    assert resp.status == 404, path
                    assert TOKEN.encode() not in await resp.read()
            async with http.post(f"{base}/job", json={"state": "running"}) as resp:
                assert resp.status == 404
    assert b"rallypoint_ready 1.0" in body
    assert b'rallypoint_http_requests_total{api="metrics",route="/metrics",status="200"}' in counted
    assert TOKEN.encode() not in body
    for key, _value in env.values:  # no served variable (numbers could match any sample)
        assert key.encode() not in body, key


async def test_it_is_off_by_default() -> None:
    async with Sidecar(_settings(), {}) as sidecar:
        assert sidecar.listeners is not None
        assert sidecar.listeners.metrics_bound == []


async def test_a_taken_port_names_its_variable() -> None:
    settings = _settings()
    taken = settings.peer_port
    other = fast_settings(local_port=free_port(), peer_port=free_port(), metrics_port=taken)
    async with Sidecar(settings, {}):
        match = f"metrics API on 0.0.0.0:{taken}.*RALLYPOINT_METRICS_PORT"
        with pytest.raises(PortError, match=match):
            async with Sidecar(other, {}):
                pass
