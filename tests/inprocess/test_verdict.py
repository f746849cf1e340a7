"""The master's cluster-wide verdict (verdict.py): when it is verified and when it moves."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint import wire
from rallypoint.core import links
from rallypoint.errors import JoinRejected
from rallypoint.model import ClusterSpec, Member
from rallypoint.reasons import Reason
from rallypoint.rendezvous.cluster.masterbook import MasterBook

HOSTS = ("m", "a", "b")
SESSION = "s"


def book_with_doc(n: int = 3) -> tuple[MasterBook, str]:
    spec = ClusterSpec("explicit", HOSTS[:n], 0, n, SESSION)
    book = MasterBook(spec, 29500, "ep")
    for rank in range(n):
        book.record(Member(rank, HOSTS[rank], (f"10.0.0.{rank + 1}",)))
    assert book.doc is not None
    return book, book.doc.generation


def report(gen: str, rank: int, *, passed: bool = True, **kw: object) -> wire.Report:
    return wire.Report(SESSION, gen, rank, HOSTS[rank], passed, **kw)  # type: ignore[arg-type]


def cut(src: int, dst: int, code: str = "peer_unreachable", cause: str = "timeout") -> Reason:
    return Reason(code, f"{HOSTS[src]} cannot reach {HOSTS[dst]}", HOSTS[dst], cause, (src, dst))


async def test_verified_only_when_every_node_passed() -> None:
    book, gen = book_with_doc()
    first = book.verdict.report(report(gen, 0))
    assert not first.verified and first.pending == (1, 2)
    book.verdict.report(report(gen, 1))
    assert not book.verdict.report(report(gen, 1)).verified
    final = book.verdict.report(report(gen, 2))
    assert final.verified and final.pending == () and final.version > first.version


async def test_versions_move_only_on_what_a_waiting_node_acts_on() -> None:
    book, gen = book_with_doc()
    start = book.verdict.report(report(gen, 0)).version
    # Another node passing is not worth waking every long-poll for ...
    assert book.verdict.report(report(gen, 1)).version == start
    # ... a failure appearing is, and so is it going away.
    failed = book.verdict.report(report(gen, 2, passed=False, failures=(cut(2, 1),)))
    assert failed.version == start + 1 and not failed.verified
    assert failed.failures[0].message == "b cannot reach a"  # already names its reporter
    repaired = book.verdict.report(report(gen, 2))
    assert repaired.verified and repaired.version == start + 2


async def test_name_failures_are_shown_with_their_reporter() -> None:
    book, gen = book_with_doc()
    reason = Reason("resolve_failed", "peer a does not resolve here", "a", "not_found", (2,))
    verdict = book.verdict.report(report(gen, 2, passed=False, failures=(reason,)))
    assert verdict.failures[0].message == "b reports: peer a does not resolve here"


async def test_a_busy_window_excuses_a_foreign_answer_on_that_port_only() -> None:
    book, gen = book_with_doc(2)
    foreign = cut(1, 0, "master_port_unreachable", "foreign_answer")
    book.verdict.report(report(gen, 1, passed=False, failures=(foreign,)))
    assert not book.verdict.report(report(gen, 0)).verified
    # The master says the job already listens on its master port: excused.
    assert book.verdict.report(report(gen, 0, busy=frozenset({"master"}))).verified
    # A timeout there is not excused: a firewall drops it whoever listens.
    dropped = cut(1, 0, "master_port_unreachable", "timeout")
    assert not book.verdict.report(report(gen, 1, passed=False, failures=(dropped,))).verified


async def test_different_mtus_are_a_warning_naming_the_nodes() -> None:
    book, gen = book_with_doc()
    for rank, mtu in ((0, 1500), (1, 1500), (2, 9000)):
        verdict = book.verdict.report(report(gen, rank, net=wire.NetFacts("eth0", mtu, False)))
    assert verdict.verified
    assert len(verdict.warnings) == 1
    assert "1500 on m (eth0), a (eth0)" in verdict.warnings[0]
    assert "9000 on b (eth0)" in verdict.warnings[0]


@pytest.mark.parametrize(
    ("change", "code"),
    [
        ({"session": "other"}, "session_mismatch"),
        ({"host": "intruder"}, "impostor"),
        ({"generation": "old.1"}, "stale_generation"),
    ],
)
async def test_reports_that_do_not_belong_are_refused(change: dict[str, str], code: str) -> None:
    book, gen = book_with_doc()
    fields = {"session": SESSION, "generation": gen, "host": "a", **change}
    bad = wire.Report(fields["session"], fields["generation"], 1, fields["host"], True)
    with pytest.raises(JoinRejected) as caught:
        book.verdict.report(bad)
    assert caught.value.code == code


async def test_a_long_poll_answers_when_the_verdict_moves() -> None:
    book, gen = book_with_doc(2)
    seen = book.verdict.report(report(gen, 0)).version
    waiting = asyncio.ensure_future(book.verdict.wait(gen, seen, timeout_s=10))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    book.verdict.report(report(gen, 1))
    verdict = await asyncio.wait_for(waiting, 5)
    assert verdict.verified


async def test_a_new_document_starts_a_new_verdict() -> None:
    book, gen = book_with_doc(2)
    book.verdict.report(report(gen, 0))
    assert book.verdict.report(report(gen, 1)).verified
    book.record(Member(1, "a", ("10.0.0.9",)))  # a re-join with new facts
    assert book.doc is not None and book.doc.generation != gen
    assert book.verdict.current is not None and not book.verdict.current.verified
    assert book.verdict.current.generation == book.doc.generation and book.verdict.reports == {}


async def test_slow_links_are_warned_once_every_node_reported_and_listed_in_status() -> None:
    book, gen = book_with_doc()
    fast, slow = links.LinkStat(1, 1000.0, 1000.0, 0.0, 0.0), links.LinkStat(2, 5.0, 5.0)
    book.verdict.report(report(gen, 0, links=(fast, slow)))
    book.verdict.report(report(gen, 1, links=(links.LinkStat(2, 4.0, 6.0, 0.0, 0.0),)))
    assert book.verdict.link_warnings == []  # not judged before every node reported
    final = book.verdict.report(report(gen, 2))
    assert final.verified  # a warning, not a failure
    assert [(w.code, w.host) for w in book.verdict.link_warnings] == [("slow_link", "b")]
    assert any("every measured link of b is slow" in w for w in final.warnings)
    view = {(row["from"], row["to"]): row["warnings"] for row in book.verdict.link_view()}
    assert view == {("m", "a"): [], ("m", "b"): ["slow_link"], ("a", "b"): ["slow_link"]}


async def test_nodes_that_differ_in_rdma_devices_are_named() -> None:
    book, gen = book_with_doc()
    book.verdict.report(report(gen, 0, net=wire.NetFacts("eth0", 1500, rdma=True)))
    book.verdict.report(report(gen, 1, net=wire.NetFacts("eth0", 1500, rdma=True)))
    final = book.verdict.report(report(gen, 2, net=wire.NetFacts("eth0", 1500, rdma=False)))
    rdma = [w for w in final.warnings if "RDMA" in w]
    assert rdma and "visible on m, a but not on b" in rdma[0], final.warnings
    same, gen2 = book_with_doc()
    for rank in range(3):
        last = same.verdict.report(report(gen2, rank, net=wire.NetFacts("eth0", 1500, rdma=True)))
    assert not any("RDMA" in w for w in last.warnings)
