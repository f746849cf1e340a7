"""Rank assignment from announcements: every node derives the same order from the same set."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.errors import ClusterSpecError
from rallypoint.mdns.ranks import assign_ranks
from rallypoint.mdns.txt import Announcement


def ann(host: str, session: str = "s", instance: str | None = None) -> Announcement:
    return Announcement(session, host, -1, 7781, "", ("10.0.0.1",), instance or f"{session}-{host}")


def test_assign_ranks_waits_for_nnodes() -> None:
    assert assign_ranks([ann("b"), ann("a")], 3) is None
    assert assign_ranks([ann("b"), ann("a"), ann("c")], 3) == ("a", "b", "c")


def test_assign_ranks_counts_hosts_not_instances() -> None:
    # A renamed duplicate ("s-a-2") is the same host: still one node.
    assert assign_ranks([ann("a"), ann("a", instance="s-a-2"), ann("b")], 3) is None


def test_assign_ranks_refuses_extra_hosts() -> None:
    with pytest.raises(ClusterSpecError, match=r"3 hosts .* RALLYPOINT_NNODES=2: a,b,c"):
        assign_ranks([ann("c"), ann("a"), ann("b")], 2)


@pytest.mark.parametrize(
    ("items", "nnodes", "fault"),
    [([ann("a", "s1"), ann("b", "s2")], 2, "several sessions"), ([ann("a")], 0, "at least 1")],
)
def test_assign_ranks_refuses_bad_input(items: list[Announcement], nnodes: int, fault: str) -> None:
    with pytest.raises(ClusterSpecError, match=fault):
        assign_ranks(items, nnodes)


hosts = st.lists(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True), min_size=1, max_size=12
)


@settings(max_examples=200)
@given(hosts, st.randoms(use_true_random=False))
def test_every_permutation_agrees(names: list[str], rnd: random.Random) -> None:
    items = [ann(h) for h in names]
    nnodes = len(set(names))
    expected = assign_ranks(items, nnodes)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    # Each node sees the same announcements in its own arrival order, repeats included.
    assert assign_ranks(shuffled + shuffled[:2], nnodes) == expected
    assert expected is not None
    assert sorted(expected) == list(expected)
    assert set(expected) == set(names)
