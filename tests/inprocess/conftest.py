"""Fixtures of the in-process tier: mDNS sessions and Rendezvous nodes behind aiohttp's client."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec
from rallypoint.net import ports
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.local import local_app
from rallypoint.server.peer import peer_app
from tests.fakes import FakeResolver
from tests.support.api import HOSTS, SESSION, Apis, Client, MakeApis
from tests.support.env import child_env
from tests.support.ports import free_port
from tests.support.served import Served
from tests.support.settings import fast_settings


@pytest.fixture
def session() -> str:
    # A fresh session per test: other suites may announce on loopback at the same time.
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def make_node() -> AsyncIterator[Callable[..., Awaitable[Rendezvous]]]:
    made: list[tuple[Rendezvous, list[ports.HeldPort]]] = []

    async def make(
        nnodes: int = 1,
        token: str | None = None,
        user: dict[str, tuple[str, str]] | None = None,
        **changes: Any,
    ) -> Rendezvous:
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
            user=user or {},
        )
        await node.__aenter__()
        made.append((node, list(held.values())))
        return node

    yield make
    for node, held in made:
        await node.close()
        for port in held:
            port.close()


@pytest.fixture
def make_apis(make_node: Callable[..., Awaitable[Rendezvous]], aiohttp_client: Client) -> MakeApis:
    """`make_node`'s node served by its peer app (which runs the rendezvous) and its local app;
    ready (a single node on its own), or with ``ready=False`` just started."""

    async def make(*, ready: bool = True, **node_args: Any) -> Apis:
        node = await make_node(**node_args)
        apis = Apis(
            node, await aiohttp_client(peer_app(node)), await aiohttp_client(local_app(node))
        )
        if ready:
            reasons = node.readiness.reasons
            assert await node.readiness.wait_ready(20), [r.as_json() for r in reasons()]
        else:
            await asyncio.sleep(0)  # the rendezvous has started
        return apis

    return make


@pytest.fixture
def start() -> Iterator[Callable[..., Served]]:
    """Start single-node sidecars on free test ports; stop them (SIGTERM, then SIGKILL) after."""
    procs: list[subprocess.Popen[str]] = []

    def start(*extra: str, local_port: int | None = None) -> Served:
        local, peer = local_port or free_port(), free_port()
        # The sidecar keeps the ports it reserves outside the kernel's ephemeral range.
        master, tf = free_port(low=20000, high=29999), free_port(low=20000, high=29999)
        args = ["serve", "--local-port", str(local), "--peer-port", str(peer),
                "--master-port", str(master), "--tf-port", str(tf), *extra]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "rallypoint", *args],
            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(proc)
        return Served(proc, local, peer, master, tf)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.communicate()


@pytest.fixture
def served(start: Callable[..., Served]) -> Served:
    return start("--no-mdns")
