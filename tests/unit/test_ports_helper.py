"""The test harness's port pool never hands out one port twice while its range lasts."""

from __future__ import annotations

import socket

from tests.support.ports import DEFAULT_RANGE, PortPool, free_port, worker_slice


def test_ports_handed_out_are_distinct() -> None:
    # Half of this worker's slice (600 draws of 2701 ports outside xdist): drawn with
    # replacement, a repeat is all but certain.
    low, high = worker_slice(*DEFAULT_RANGE)
    pool = PortPool()
    ports = [pool.take("127.0.0.1", low, high) for _ in range(min(600, (high - low + 1) // 2))]
    assert len(set(ports)) == len(ports)
    assert all(low <= port <= high for port in ports)
    assert DEFAULT_RANGE[0] <= free_port() <= DEFAULT_RANGE[1]


def test_workers_side_by_side_draw_from_disjoint_slices() -> None:
    low, high = DEFAULT_RANGE
    slices = [
        worker_slice(low, high, {"PYTEST_XDIST_WORKER": f"gw{i}", "PYTEST_XDIST_WORKER_COUNT": "6"})
        for i in range(6)
    ]
    ports = [port for start, end in slices for port in range(start, end + 1)]
    assert len(ports) == len(set(ports)) >= (high - low + 1) - 6
    assert all(low <= port <= high for port in ports)
    assert worker_slice(low, high, {}) == (low, high)  # not side by side: the whole range
    # A range too narrow to share out is shared whole.
    assert worker_slice(
        100, 199, {"PYTEST_XDIST_WORKER": "gw1", "PYTEST_XDIST_WORKER_COUNT": "4"}
    ) == (
        100,
        199,
    )


#: Just above DEFAULT_RANGE and below the kernel's ephemeral ports (32768-): nothing else on
#: the machine binds these, and no outgoing connection leaves one in TIME_WAIT.
SPARE = 32710


def test_a_bound_port_is_not_handed_out() -> None:
    pool = PortPool()
    taken = SPARE + 4
    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        others = [pool.take("127.0.0.1", SPARE, SPARE + 9) for _ in range(7)]
    assert len(set(others)) == 7
    assert taken not in others


def test_a_used_up_range_starts_over() -> None:
    pool = PortPool()
    low = SPARE + 20
    ports = [pool.take("127.0.0.1", low, low + 3) for _ in range(12)]
    assert set(ports) <= set(range(low, low + 4))


def test_starting_over_keeps_the_latest_ports_out() -> None:
    # The ports a test took last are not bound yet when the range starts over: handing
    # one out again gave two nodes of one test the same port.
    pool = PortPool()
    low = SPARE + 30
    ports = [pool.take("127.0.0.1", low, low + 7) for _ in range(64)]
    assert set(ports) <= set(range(low, low + 8))
    windows = [ports[i : i + 4] for i in range(len(ports) - 3)]
    assert all(len(set(window)) == 4 for window in windows), ports
