"""A known worker joining again restarts the master's checks only when they wait on it.

A failure between two other nodes, shown on the master from their report, is theirs to
retry: the master checking again cannot mend it, and restarting its own checks then raced
the cluster's verdict (the others turned ready and closed their windows while the master's
new checks of them were refused, and it never turned ready).
"""

from __future__ import annotations

from rallypoint.reasons import Reason
from rallypoint.rendezvous.checks.verification import waits_on

MASTER = 0


def test_the_masters_own_failure_of_the_host_waits_on_it() -> None:
    own = Reason("peer_unreachable", "main1 cannot reach sub1", host="sub1", ranks=(0, 1))
    assert waits_on([own], "sub1", MASTER)


def test_a_name_or_join_reason_about_the_host_waits_on_it() -> None:
    for ranks in [(), (1,)]:
        named = Reason("peer_not_found", "sub1 does not resolve", host="sub1", ranks=ranks)
        assert waits_on([named], "sub1", MASTER)


def test_a_failure_between_two_other_nodes_does_not() -> None:
    theirs = Reason("peer_unreachable", "sub2 cannot reach sub1", host="sub1", ranks=(2, 1))
    assert not waits_on([theirs], "sub1", MASTER)
    assert waits_on([theirs], "sub1", 2)  # on sub2 itself, it is its own


def test_a_reason_about_another_host_does_not() -> None:
    other = Reason("peer_unreachable", "main1 cannot reach sub2", host="sub2", ranks=(0, 2))
    assert not waits_on([other], "sub1", MASTER)
