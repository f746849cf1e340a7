"""The test harness's port pool never hands out one port twice while its range lasts."""

from __future__ import annotations

import socket

from tests.support.ports import DEFAULT_RANGE, PortPool, free_port


def test_ports_handed_out_are_distinct() -> None:
    # 600 draws from 2701 ports: drawn with replacement, a repeat is all but certain.
    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
    assert all(DEFAULT_RANGE[0] <= port <= DEFAULT_RANGE[1] for port in ports)


def test_a_bound_port_is_not_handed_out() -> None:
    pool = PortPool()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        low = max(taken - 4, 1024)
        others = [pool.take("127.0.0.1", low, low + 9) for _ in range(7)]
    assert len(set(others)) == 7
    assert taken not in others


def test_a_used_up_range_starts_over() -> None:
    pool = PortPool()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        low = held.getsockname()[1] + 1
    ports = [pool.take("127.0.0.1", low, low + 3) for _ in range(12)]
    assert set(ports) <= set(range(low, low + 4))
