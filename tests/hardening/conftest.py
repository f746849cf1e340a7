"""Fixtures of the hardening tests: a background event loop and long-lived in-process sidecars."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.hardening.harness import LoopThread, Node, Records, recording, start_node


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    yield thread
    thread.close()


@pytest.fixture(scope="module")
def logs() -> Iterator[Records]:
    with recording() as records:
        yield records


@pytest.fixture(autouse=True)
def _fresh_logs(logs: Records) -> None:
    """Each test judges only the log lines emitted while it ran."""
    logs.clear()


@pytest.fixture(scope="module")
def ready_node(loop_thread: LoopThread, logs: Records) -> Iterator[Node]:
    """A single-node session, ready: /env serves, GET /v1/cluster answers at once."""
    node = loop_thread.run(start_node(["node0"]))
    readiness = node.sidecar.node.readiness
    assert loop_thread.run(readiness.wait_ready(20)), readiness.reasons()
    yield node
    loop_thread.run(node.sidecar.stop())


@pytest.fixture(scope="module")
def waiting_master(loop_thread: LoopThread, logs: Records) -> Iterator[Node]:
    """The master of a 3-node session whose workers never come (unless a test joins them)."""
    node = loop_thread.run(start_node(["node0", "node1", "node2"], long_poll_s=0.2))
    yield node
    loop_thread.run(node.sidecar.stop())
