"""Fixtures of the in-process tier: mDNS sessions and Rendezvous nodes behind aiohttp's client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from rallypoint import ports
from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.rendezvous.node import Rendezvous
from tests.fakes import FakeResolver
from tests.support.api import HOSTS, SESSION
from tests.support.settings import fast_settings


@pytest.fixture
def session() -> str:
    # A fresh session per test: other suites may announce on loopback at the same time.
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def make_node() -> AsyncIterator[Callable[..., Awaitable[Rendezvous]]]:
    made: list[tuple[Rendezvous, list[ports.HeldPort]]] = []

    async def make(nnodes: int = 1, token: str | None = None, **changes: Any) -> Rendezvous:
        # The API is under test here; probes have their own tests (test_connectivity).
        values: dict[str, Any] = {"long_poll_s": 5.0, "backoff_max_s": 0.1, "probe": False}
        settings = fast_settings(token=token, **{**values, **changes})
        spec = ClusterSpec("explicit", HOSTS[:nnodes], 0, nnodes, SESSION, loopback_ok=True)
        held = {
            "master": ports.reserve([], settings.port_range),
            "tf": ports.reserve([], settings.port_range),
        }
        resolver = FakeResolver({"node0": ["127.0.0.1"], "node1": ["127.0.0.2"]})
        node = Rendezvous(
            spec,
            settings,
            resolver=resolver,
            auth=Authenticator(token),
            metrics=Metrics(),
            addresses=["127.0.0.1"],
            held=held,
            user={},
        )
        await node.__aenter__()
        made.append((node, list(held.values())))
        return node

    yield make
    for node, held in made:
        await node.close()
        for port in held:
            port.close()
