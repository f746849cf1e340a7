"""The checks on uvloop, the event loop `serve` runs on by default (--event-loop auto).

The rest of this tier runs on asyncio's own loop (pytest-asyncio's). Here the same pieces
run inside `uvloop.run`, as `serve` runs them: the probe windows and their answers (uvloop's
transports are not asyncio.Transport subclasses), the prober's raw-socket calls, and a
whole rendezvous with every connection check and the master's verdict.
"""

from __future__ import annotations

import asyncio

import uvloop

from rallypoint import ports, probe
from rallypoint.auth import Authenticator
from rallypoint.cli.fastserve import loop_runner
from rallypoint.metrics import Metrics
from tests.support.cluster import Cluster, all_ready, until


def _on_uvloop(scenario: object) -> None:
    async def checked() -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
        await scenario  # type: ignore[misc]

    loop_runner("uvloop")(checked())


async def _probe(port: int, auth: Authenticator, rank: int, host: str) -> probe.Outcome:
    return await probe.probe(
        "127.0.0.1", port, session="s", auth=auth, rank=rank, host=host, timeout_s=2.0
    )


def test_a_window_answers_probes_and_refuses_strangers_on_uvloop() -> None:
    async def scenario() -> None:
        held = ports.reserve_ephemeral()
        metrics = Metrics()
        listener = probe.ProbeListener(
            session="s", rank=1, host="node1", auth=Authenticator("tok"), metrics=metrics
        )
        try:
            await listener.serve(held.listen())
            assert (await _probe(held.port, Authenticator("tok"), 1, "node1")).ok
            wrong_token = await _probe(held.port, Authenticator("other"), 1, "node1")
            assert wrong_token.cause == "foreign_answer"
            other_node = await _probe(held.port, Authenticator("tok"), 2, "node2")
            assert other_node.cause == "wrong_peer"
            _reader, writer = await asyncio.open_connection("127.0.0.1", held.port)
            writer.write(b"GET / HTTP/1.1\r\n\r\n")
            await writer.drain()
            await until(
                lambda: metrics.value("rallypoint_probes_answered_total", result="garbage") == 1
            )
            writer.close()
            assert metrics.value("rallypoint_probes_answered_total", result="answered") == 3
        finally:
            await listener.close()
            held.close()

    _on_uvloop(scenario())


def test_a_cluster_checks_every_pair_and_turns_ready_on_uvloop() -> None:
    async def scenario() -> None:
        c = Cluster(3, per_node={rank: {"probe_timeout_s": 0.5} for rank in range(3)})
        try:
            for rank in range(3):
                await c.start(rank)
            await all_ready(c)
            for rank, sidecar in c.nodes.items():
                node = sidecar.node
                sent = node.metrics.value("rallypoint_probes_sent_total", kind="probe", cause="ok")
                assert sent >= 2, (rank, sent)
                assert node.status()["checks"]["verdict"]["verified"] is True
        finally:
            await c.close()

    _on_uvloop(scenario())


def test_the_loop_is_chosen_as_asked() -> None:
    assert loop_runner("asyncio") is asyncio.run
    assert loop_runner("uvloop") is uvloop.run
    assert loop_runner("auto") is uvloop.run  # a dependency wherever `serve` runs
