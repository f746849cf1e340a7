"""The JAX coordinator port: held by the master's sidecar and served on every node."""

from __future__ import annotations

import errno
import socket

import pytest

from rallypoint.errors import PortError
from rallypoint.model import ClusterSpec
from rallypoint.sidecar import Sidecar
from tests.fakes import FakeResolver
from tests.support.cluster.inprocess import SESSION, all_ready, cluster
from tests.support.ports import free_port
from tests.support.settings import fast_settings

JAX_ON = {"frameworks": frozenset({"torch", "jax"})}


def plain_bind(port: int) -> int:
    """0 when a plain bind of the port succeeds, else the errno."""
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError as exc:
            return exc.errno or -1
    return 0


def free_non_ephemeral_port() -> int:
    """A port outside the ephemeral range that a plain bind gets right now."""
    for port in range(21500, 22000):
        if plain_bind(port) == 0:
            return port
    raise AssertionError("no free port in 21500-21999")


async def test_the_master_holds_the_coordinator_port_and_every_node_serves_it() -> None:
    wanted = free_non_ephemeral_port()
    per_node = {rank: {**JAX_ON, "jax_port": wanted} for rank in range(3)}
    async with cluster(3, per_node=per_node) as c:
        for rank in range(3):
            await c.start(rank)
        await all_ready(c)
        held = c.nodes[0].node.status()["ports"]
        assert held["jax"]["port"] == wanted and held["jax"]["held"]  # type: ignore[index]
        # Workers hold no coordinator port of their own.
        assert "jax" not in c.nodes[1].node.status()["ports"]  # type: ignore[operator]
        assert plain_bind(wanted) == errno.EADDRINUSE
        master_port = held["master"]["port"]  # type: ignore[index]
        assert master_port != wanted
        for rank in range(3):
            env = c.nodes[rank].node.readiness.env
            assert env is not None
            assert env.get("JAX_COORDINATOR_ADDRESS") == f"node0:{wanted}"
            assert env.get("JAX_NUM_PROCESSES") == "3"
            assert env.get("JAX_PROCESS_ID") == str(rank)
            bind = env.get("JAX_COORDINATOR_BIND_ADDRESS")
            assert bind == (f"[::]:{wanted}" if rank == 0 else None)


async def test_a_taken_preferred_coordinator_port_is_skipped() -> None:
    with socket.socket() as thief:
        thief.bind(("0.0.0.0", 0))
        taken = int(thief.getsockname()[1])
        per_node = {rank: {**JAX_ON, "jax_port": taken} for rank in range(2)}
        async with cluster(2, per_node=per_node) as c:
            for rank in range(2):
                await c.start(rank)
            await all_ready(c)
            port = c.nodes[0].node.status()["ports"]["jax"]  # type: ignore[index]
            assert port["port"] != taken and port["skipped"][0]["port"] == taken
            env = c.nodes[1].node.readiness.env
            assert env is not None
            assert env.get("JAX_COORDINATOR_ADDRESS") == f"node0:{port['port']}"


async def test_a_user_coordinator_port_that_is_taken_is_an_error() -> None:
    with socket.socket() as thief:
        thief.bind(("0.0.0.0", 0))
        taken = int(thief.getsockname()[1])
        settings = fast_settings(local_port=free_port(), peer_port=free_port(), **JAX_ON)
        spec = ClusterSpec("explicit", ("node0",), 0, 1, SESSION, loopback_ok=True)
        environ = {"JAX_COORDINATOR_ADDRESS": f"node0:{taken}"}
        sidecar = Sidecar(settings, environ, resolver=FakeResolver(), spec=spec)
        with pytest.raises(PortError, match=f"JAX_COORDINATOR_ADDRESS=node0:{taken}"):
            await sidecar.start()
