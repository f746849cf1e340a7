"""An excused verdict's detail in /status says what the lookup found, never the remedy."""

from __future__ import annotations

from rallypoint.core import names
from rallypoint.model import ClusterSpec
from rallypoint.rendezvous.peers import PeerTable
from rallypoint.rendezvous.status import peer_json


def _table(res: names.Resolution, excused: str | None) -> PeerTable:
    table = PeerTable(ClusterSpec("explicit", ("n0", "n1"), 0, 2, "s"))
    table.resolved(0, res, excused=excused)
    return table


def test_an_excused_loopback_verdict_keeps_the_fact_and_drops_the_remedy() -> None:
    res = names.classify("n0", ["10.0.0.5", "127.0.1.1"], None, elapsed_s=0.0)
    assert res.verdict is names.Verdict.LOOPBACK and "map the name" in res.detail
    row = peer_json(_table(res, "gloo binds eth0 (GLOO_SOCKET_IFNAME)")[0])
    assert row["detail"] == "n0 resolves to loopback 127.0.1.1 (answers: 10.0.0.5, 127.0.1.1)"
    assert res.detail.startswith(str(row["detail"]) + "; ")


def test_a_loopback_verdict_that_is_a_problem_keeps_its_remedy() -> None:
    res = names.classify("n0", ["127.0.1.1"], None, elapsed_s=0.0)
    row = peer_json(_table(res, None)[0])
    assert row["detail"] == res.detail and "map the name" in str(row["detail"])
