"""The test harness's port pool never hands out one port twice while its range lasts."""

from __future__ import annotations

import socket

from tests.support.ports import DEFAULT_RANGE, PortPool, free_port


def test_ports_handed_out_are_distinct() -> None:
    # 600 draws from 2701 ports: drawn with replacement, a repeat is all but certain.
    ports = [free_port() for _ in range(600)]
    assert len(set(ports)) == len(ports)
    assert all(DEFAULT_RANGE[0] <= port <= DEFAULT_RANGE[1] for port in ports)


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
