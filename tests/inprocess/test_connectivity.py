"""Connection checks in one event loop: probes, windows on held ports, the cluster-wide verdict.

Probes are steered by the route seam: a pair can be sent to a silent listener (a drop),
a closed port (a reject) or a stranger that answers garbage, while every other probe goes
to loopback where each node holds its own ports.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from rallypoint.auth import Authenticator
from rallypoint.metrics import Metrics
from rallypoint.net import ports, probe
from rallypoint.reasons import Reason
from rallypoint.sidecar import Sidecar
from tests.conftest import require
from tests.support.cluster.inprocess import all_ready, codes, moved_on, until
from tests.support.steered import FAST, Steered, closed_port, start_steered
from tests.support.tcpstore import run_tcpstore, torch_available


@pytest.fixture
def silent() -> Iterator[tuple[str, int]]:
    """A port whose handshakes never complete, like a firewall that drops: a listener with
    a full accept queue (Linux then drops further SYNs)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = int(listener.getsockname()[1])
    filler = socket.create_connection(("127.0.0.1", port))
    yield "127.0.0.1", port
    filler.close()
    listener.close()


@pytest.fixture
async def mute() -> AsyncIterator[tuple[str, int]]:
    """A listener that accepts and never answers: something else listens there."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    yield "127.0.0.1", server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def stranger() -> AsyncIterator[tuple[str, int]]:
    """A listener that answers every connection with an HTTP error, like another service."""

    async def answer(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield "127.0.0.1", server.sockets[0].getsockname()[1]
    server.close()


def reason_of(sidecar: Sidecar, code: str) -> Reason:
    return next(r for r in sidecar.node.readiness.reasons() if r.code == code)


async def test_a_clean_cluster_probes_every_pair_and_closes_its_windows() -> None:
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    try:
        await start_steered(c)
        await all_ready(c)
        for rank, sidecar in c.nodes.items():
            node = sidecar.node
            sent = node.metrics.value("rallypoint_probes_sent_total", kind="probe", cause="ok")
            assert sent >= 2, (rank, sent)  # both peers' probe ports
            tf = node.metrics.value("rallypoint_probes_sent_total", kind="tf", cause="ok")
            assert tf >= 2
            master = node.metrics.value("rallypoint_probes_sent_total", kind="master", cause="ok")
            assert (master >= 1) == (rank != 0)
            assert node.windows is not None
            assert set(node.windows.state.values()) == {"closed"}
            checks = node.status()["checks"]
            assert checks["verdict"]["verified"] is True
        # The master's view lists every node's report.
        cluster_view = c.nodes[0].node.status()["cluster"]
        assert [n["rank"] for n in cluster_view] == [0, 1, 2]
        assert all(n["passed"] for n in cluster_view)
    finally:
        await c.close()


async def test_a_peer_is_probed_as_soon_as_its_name_passed() -> None:
    """node1's lookup of node2 hangs: node1 already tries the master's ports meanwhile, and
    turns ready only once node2's name passed too (its early outcomes count then)."""
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    node2 = c.resolvers[1]["node2"]
    c.resolvers[1].set("node2", node2, hang=True)
    try:
        await start_steered(c)
        metrics = c.nodes[1].node.metrics

        def probed(kind: str) -> float:
            return metrics.value("rallypoint_probes_sent_total", kind=kind, cause="ok")

        await until(lambda: probed("master") >= 1 and probed("probe") >= 1)
        assert not c.nodes[1].node.readiness.ready
        assert "verifying" in codes(c.nodes[1])
        c.resolvers[1].set("node2", node2)  # the next lookup (after the check's timeout) answers
        await all_ready(c)
        # node2's ports were tried too, and every node's verdict says all passed.
        assert probed("probe") >= 2
        assert all(s.node.status()["checks"]["verdict"]["verified"] for s in c.nodes.values())
    finally:
        await c.close()


async def test_the_master_announces_its_generation_once_its_own_checks_passed() -> None:
    """node1 cannot reach node2, so nobody turns ready. The master's generation is announced
    all the same (its mDNS announcement wakes a worker that missed the poke), node1's once
    its failure is known, node2's not while it only waits for the verdict."""
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    c.detours[(1, "node2")] = ("127.0.0.1", closed_port())
    announced: dict[int, list[str]] = {0: [], 1: [], 2: []}
    try:
        for rank in range(3):
            c.route = c.route_for(rank)  # type: ignore[method-assign]
            sidecar = await c.start(rank)
            sidecar.node.on_generation.append(
                lambda doc, r=rank: announced[r].append(doc.generation)
            )
        await until(lambda: bool(announced[0]) and bool(announced[1]))
        await until(
            lambda: "cluster_failed" in codes(c.nodes[2]) or "peer_unreachable" in codes(c.nodes[2])
        )
        assert not any(s.node.readiness.ready for s in c.nodes.values())
        assert announced[0] == announced[1] == [c.nodes[0].node.verification.generation]
        assert announced[2] == []
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("detour", "cause"),
    [
        ("silent", "timeout"),
        ("closed", "refused"),
        ("stranger", "foreign_answer"),
        ("mute", "foreign_answer"),
    ],
)
async def test_a_cut_pair_keeps_every_node_not_ready_until_repaired(
    detour: str,
    cause: str,
    silent: tuple[str, int],
    stranger: tuple[str, int],
    mute: tuple[str, int],
) -> None:
    where = {
        "silent": silent,
        "closed": ("127.0.0.1", closed_port()),
        "stranger": stranger,
        "mute": mute,
    }
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    c.detours[(1, "node2")] = where[detour]
    try:
        await start_steered(c)
        # Every node names the pair: node1 -> node2, whichever node is asked.
        await until(lambda: all("peer_unreachable" in codes(s) for s in c.nodes.values()))
        for rank, sidecar in c.nodes.items():
            assert not sidecar.node.readiness.ready
            reason = reason_of(sidecar, "peer_unreachable")
            assert reason.message.startswith("node1 cannot reach node2 (198.51.100.12) on tcp/")
            assert reason.detail == cause and reason.ranks == (1, 2) and reason.host == "node2"
            async with aiohttp.ClientSession() as http, http.get(c.local_url(rank, "/readyz")) as r:
                assert r.status == 503
        # The fault is repaired while the cluster waits: ready without a restart.
        del c.detours[(1, "node2")]
        await all_ready(c)
    finally:
        await c.close()


async def test_the_master_port_answered_by_a_stranger_is_not_ready(
    stranger: tuple[str, int],
) -> None:
    c = Steered(2, per_node={rank: dict(FAST) for rank in range(2)})
    try:
        await c.start(0)
        master_port = c.nodes[0].node.held["master"].port
        # Only node1's probe of the master *port* goes to the stranger.
        original = c.route_for(1)

        def route(host: str, address: str, port: int) -> tuple[str, int]:
            return stranger if port == master_port else original(host, address, port)

        c.route = route  # type: ignore[method-assign]
        await c.start(1)
        await until(lambda: "master_port_unreachable" in codes(c.nodes[0]))
        reason = reason_of(c.nodes[0], "master_port_unreachable")
        assert f"tcp/{master_port}" in reason.message and reason.detail == "foreign_answer"
        assert "not a probe answer" in reason.message
    finally:
        await c.close()


async def test_probes_off_turns_ready_on_names_alone(silent: tuple[str, int]) -> None:
    c = Steered(2, per_node={rank: {"probe": False} for rank in range(2)})
    c.detours[(1, "node0")] = silent
    try:
        await start_steered(c)
        await all_ready(c)
        assert "probe" not in c.nodes[1].node.held
        assert c.nodes[1].node.status()["checks"]["enabled"] is False
    finally:
        await c.close()


async def test_a_busy_master_window_is_excused_when_the_job_already_listens() -> None:
    """After a generation change the job's own listener may hold the master port: a peer's
    probe then meets it (foreign answer), which the master excuses for that port only."""
    c = Steered(2, per_node={rank: dict(FAST) for rank in range(2)})
    job: asyncio.Server | None = None
    try:
        await start_steered(c)
        await all_ready(c)
        held = c.nodes[0].node.held["master"]

        async def hang_up(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()  # a store that does not understand the probe hangs up

        job = await asyncio.start_server(hang_up, "0.0.0.0", held.port, reuse_address=True)
        old = c.nodes[1].node.verification.generation
        # node1 restarts with new facts (a new probe port): a new generation for everyone.
        await c.stop(1)
        c.route = c.route_for(1)  # type: ignore[method-assign]
        await c.start(1)
        await moved_on(c, old)
        windows = c.nodes[0].node.windows
        assert windows is not None
        report = c.nodes[0].node.book.verdict.reports[0] if c.nodes[0].node.book else None
        assert report is not None and "master" in report.busy
    finally:
        if job is not None:
            job.close()
        await c.close()


async def test_a_window_busy_with_a_job_that_then_stopped_opens_after_all() -> None:
    """The master's window found the job's listener on the master port when a new
    generation began; the job then stopped. A peer that probes the port afterwards must find
    the window open (on the code before, it was refused until the deadline and beyond)."""
    c = Steered(2, per_node={rank: dict(FAST) for rank in range(2)})
    job: asyncio.Server | None = None
    try:
        await start_steered(c)
        await all_ready(c)
        master_port = c.nodes[0].node.held["master"].port
        job = await asyncio.start_server(
            lambda _r, w: w.close(), "0.0.0.0", master_port, reuse_address=True
        )
        old = c.nodes[1].node.verification.generation
        # node1 comes back with new facts; its probes of the master port are held off (a
        # closed port) until the job has stopped.
        fresh, held_off, cut = c.route_for(1), [True], closed_port()

        def route(host: str, address: str, port: int) -> tuple[str, int]:
            if held_off[0] and port == master_port:
                return "127.0.0.1", cut
            return fresh(host, address, port)

        await c.stop(1)
        c.route = route  # type: ignore[method-assign]
        await c.start(1)
        windows = c.nodes[0].node.windows
        assert windows is not None
        await until(lambda: windows.busy == {"master"})
        job.close()
        await job.wait_closed()
        job = None
        held_off[0] = False
        await moved_on(c, old)
    finally:
        if job is not None:
            job.close()
        await c.close()


@pytest.mark.torch
async def test_tcpstore_binds_the_master_port_after_the_window() -> None:
    """The sequence the job depends on: window open, probed, closed, then a real TCPStore."""
    require(torch_available(), "torch is not installed (pip install 'rallypoint[torch]')")
    c = Steered(2, per_node={rank: dict(FAST) for rank in range(2)})
    try:
        await start_steered(c)
        await all_ready(c)
        node = c.nodes[0].node
        assert node.metrics.value("rallypoint_probes_answered_total", result="answered") >= 1
        port = node.held["master"].port
        done = await asyncio.to_thread(run_tcpstore, port, True)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "ok"
        assert node.held["master"].held  # the hold stays through it all
    finally:
        await c.close()


async def _probe_once(port: int, auth: Authenticator, rank: int, host: str) -> probe.Outcome:
    return await probe.probe(
        "127.0.0.1", port, session="s", auth=auth, rank=rank, host=host, timeout_s=1.0
    )


@pytest.fixture
async def window() -> AsyncIterator[tuple[ports.HeldPort, probe.ProbeListener, Metrics]]:
    held = ports.reserve_ephemeral()
    metrics = Metrics()
    listener = probe.ProbeListener(
        session="s", rank=1, host="node1", auth=Authenticator("tok"), metrics=metrics
    )
    await listener.serve(held.listen())
    yield held, listener, metrics
    await listener.close()
    held.close()


async def test_a_probe_answer_needs_the_token_and_names_the_node(
    window: tuple[ports.HeldPort, probe.ProbeListener, Metrics],
) -> None:
    held, _, _ = window
    assert (await _probe_once(held.port, Authenticator("tok"), 1, "node1")).ok
    wrong_token = await _probe_once(held.port, Authenticator("other"), 1, "node1")
    assert wrong_token.cause == "foreign_answer" and "token" in wrong_token.detail
    other_node = await _probe_once(held.port, Authenticator("tok"), 2, "node2")
    assert other_node.cause == "wrong_peer" and "node1 (rank 1)" in other_node.detail


@pytest.mark.parametrize(
    "send",
    [b"GET / HTTP/1.1\r\n\r\n", b"RPPROBE/1 nothex\n", b"x" * 5000, b"", b"RPPROBE/1 "],
    ids=["http", "bad-nonce", "long-line", "silent", "half"],
)
async def test_the_window_survives_strangers(
    window: tuple[ports.HeldPort, probe.ProbeListener, Metrics], send: bytes
) -> None:
    held, _, metrics = window
    # A burst of strangers at once, each sending junk or nothing and hanging on.
    writers = []
    for _ in range(50):
        _reader, writer = await asyncio.open_connection("127.0.0.1", held.port)
        writer.write(send)
        writers.append(writer)
    await asyncio.gather(*(w.drain() for w in writers), return_exceptions=True)
    # A real probe still gets its answer meanwhile.
    assert (await _probe_once(held.port, Authenticator("tok"), 1, "node1")).ok
    for writer in writers:
        writer.close()
    await until(
        lambda: (
            metrics.value("rallypoint_probes_answered_total", result="garbage")
            + metrics.value("rallypoint_probes_answered_total", result="silent")
            + metrics.value("rallypoint_probes_answered_total", result="broken")
            >= 50
        ),
        timeout_s=10,
    )
    assert held.held


async def test_a_probe_that_hangs_is_bounded(silent: tuple[str, int]) -> None:
    outcome = await probe.probe(
        *silent, session="s", auth=Authenticator(None), rank=0, host="n", timeout_s=0.2
    )
    assert outcome.cause == "timeout" and "0.2 s" in outcome.detail


async def test_a_flood_on_the_windows_leaves_the_api_and_the_verdict_intact(
    silent: tuple[str, int],
) -> None:
    """Strangers flood a waiting node's probe window past its connection limit: the local
    API keeps answering, and the cluster still turns ready once the real fault is fixed."""
    c = Steered(3, per_node={rank: dict(FAST) for rank in range(3)})
    c.detours[(2, "node0")] = silent  # keeps every node waiting, windows open
    strangers: list[asyncio.StreamWriter] = []
    try:
        await start_steered(c)
        await until(lambda: "peer_unreachable" in codes(c.nodes[1]))
        port = c.nodes[1].node.held["probe"].port
        for _ in range(probe.MAX_CONNECTIONS + 44):
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET / HTTP/1.0")  # and never a newline: each holds a slot
            strangers.append(writer)
        metrics = c.nodes[1].node.metrics
        await until(
            lambda: metrics.value("rallypoint_probes_answered_total", result="refused_busy") > 0
        )
        async with aiohttp.ClientSession() as http, http.get(c.local_url(1, "/livez")) as r:
            assert r.status == 200
        del c.detours[(2, "node0")]
        await all_ready(c)
    finally:
        for writer in strangers:
            writer.close()
        await c.close()


async def test_the_jax_coordinator_port_is_probed_when_jax_is_served() -> None:
    """With jax served the master's coordinator port gets a window too; a worker cut off from
    it (here: steered to a closed port) names it, and the cluster is not ready."""
    jax_on = {"frameworks": frozenset({"torch", "jax"}), **FAST}
    c = Steered(2, per_node={rank: dict(jax_on) for rank in range(2)})
    try:
        await c.start(0)
        jax_port = c.nodes[0].node.held["jax"].port
        windows = c.nodes[0].node.windows
        assert windows is not None
        await until(lambda: windows.state.get("jax") == "open")
        original = c.route_for(1)
        cut_off = closed_port()

        def route(host: str, address: str, port: int) -> tuple[str, int]:
            return ("127.0.0.1", cut_off) if port == jax_port else original(host, address, port)

        c.route = route  # type: ignore[method-assign]
        await c.start(1)
        await until(lambda: "jax_port_unreachable" in codes(c.nodes[0]))
        reason = reason_of(c.nodes[0], "jax_port_unreachable")
        assert f"tcp/{jax_port}" in reason.message and "JAX coordinator" in reason.message
        assert reason.detail == "refused" and reason.ranks == (1, 0)
        c.route = original  # type: ignore[method-assign]
        await c.stop(1)
        await c.start(1)  # the same worker without the fault
        await all_ready(c)
        sent = c.nodes[1].node.metrics.value("rallypoint_probes_sent_total", kind="jax", cause="ok")
        assert sent >= 1
    finally:
        await c.close()
