"""core/fanout.py: every node derives the same tree; each worker has one way to the master."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.core import fanout


@pytest.mark.parametrize(
    ("nnodes", "setting", "size"),
    [
        (8, None, 0),  # small: every worker joins the master
        (fanout.AUTO_MIN_NODES - 1, None, 0),
        (fanout.AUTO_MIN_NODES, None, 23),  # about sqrt(N)
        (4097, None, 65),
        (16385, None, fanout.MAX_GROUP),
        (100_000, None, fanout.MAX_GROUP),
        (7, 3, 3),
        (7, 0, 0),
        (7, 1, 0),
        (7, 7, 0),  # one group holding everyone is no tree
        (1000, 500, fanout.MAX_GROUP),
    ],
)
def test_group_size(nnodes: int, setting: int | None, size: int) -> None:
    assert fanout.group_size(nnodes, setting) == size


def test_a_small_tree_by_hand() -> None:
    # 7 nodes in groups of 3: the master serves 1-2, rank 3 relays for 4-5, rank 6 is alone.
    assert [fanout.relay_of(r, 3) for r in range(7)] == [None, None, None, None, 3, 3, None]
    assert list(fanout.relays(3, 7)) == [3, 6]
    assert fanout.group(3, 3, 7) == range(4, 6)
    assert fanout.group(6, 3, 7) == range(0)  # a relay with nobody to serve
    assert fanout.group(4, 3, 7) == range(0)  # not a relay
    assert fanout.group(0, 3, 7) == range(0)  # the master is not a relay


@given(st.integers(2, 70_000), st.one_of(st.none(), st.integers(0, 200)))
def test_every_worker_has_exactly_one_way_to_the_master(nnodes: int, setting: int | None) -> None:
    size = fanout.group_size(nnodes, setting)
    served = [0] * nnodes
    for relay in fanout.relays(size, nnodes):
        for rank in fanout.group(relay, size, nnodes):
            served[rank] += 1
            assert fanout.relay_of(rank, size) == relay
    for rank in range(1, nnodes):
        direct = fanout.relay_of(rank, size) is None
        assert served[rank] == (0 if direct else 1)
        relay = fanout.relay_of(rank, size)
        if relay is not None:
            assert fanout.relay_of(relay, size) is None  # one level: relays join the master
            assert 0 < relay < rank
    assert size == 0 or 2 <= size <= fanout.MAX_GROUP
