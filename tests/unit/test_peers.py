"""The peer table: the one writer of what a node knows about each node of its session."""

from __future__ import annotations

from rallypoint.core.names import Resolution, Verdict
from rallypoint.model import ClusterSpec, Member
from rallypoint.rendezvous.peers import PeerTable

SPEC = ClusterSpec("explicit", ("a0", "a1", "a2"), 0, 3, "sess")


def test_a_join_keeps_its_time_until_the_facts_change() -> None:
    table = PeerTable(SPEC)
    table.joined(Member(1, "a1", ("10.0.0.2",), 2300), "10.0.0.2", 1.5)
    table.joined(Member(1, "a1", ("10.0.0.2",), 2300), "10.0.0.2", 4.0)
    assert table[1].joined and table[1].joined_after_s == 1.5 and table[1].remote == "10.0.0.2"
    table.joined(Member(1, "a1", ("10.0.0.9",), 2301), "10.0.0.9", 7.0)
    assert (table[1].joined_after_s, table[1].addresses, table[1].tf_port) == (
        7.0,
        ("10.0.0.9",),
        2301,
    )
    assert not table[2].joined


def test_a_document_marks_every_member_joined() -> None:
    table = PeerTable(SPEC)
    table.listed([Member(r, h, (f"10.0.0.{r + 1}",), None) for r, h in enumerate(SPEC.hosts)])
    assert all(peer.joined for peer in table.values())
    assert table[2].addresses == ("10.0.0.3",) and table[2].remote is None


def test_scope_and_resolutions() -> None:
    table = PeerTable(SPEC)
    table.scope([0, 2])
    assert table.in_scope() == [0, 2]
    table.scope([1])
    assert table.in_scope() == [1]
    res = Resolution("a1", Verdict.OK, ("10.0.0.2",), "ok", 1, 0.01)
    table.resolved(1, res)
    assert table[1].resolution is res and table[0].resolution is None
    assert len(table) == 3 and [rank for rank, _ in table.items()] == [0, 1, 2]
