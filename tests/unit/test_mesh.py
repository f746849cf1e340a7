"""The mesh view (core/mesh.py) from reports, and its rendering for `rallypoint status --mesh`."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint import wire
from rallypoint.cli.meshview import format_mesh, mesh_ok
from rallypoint.cli.status import format_status
from rallypoint.core import mesh
from rallypoint.core.links import LinkStat
from rallypoint.errors import PeerMessageError
from rallypoint.reasons import Reason, unreachable_reason
from rallypoint.wire import routes
from tests.support.shown import status_view

HOSTS = ["main1", "sub1", "sub2", "sub3"]


def report(
    rank: int, *, passed: bool = False, failures: tuple[Reason, ...] = (), **kw: object
) -> wire.Report:
    return wire.Report("s", "e.1", rank, HOSTS[rank], passed, failures, **kw)  # type: ignore[arg-type]


def cut(a: int, b: int, cause: str = "timeout") -> Reason:
    """The failure node ``a`` reports when its probe of ``b`` fails with ``cause``."""
    return unreachable_reason(
        (a, HOSTS[a]), (b, HOSTS[b], f"10.0.0.{b + 1}"), "probe", 7000, cause, "timed out"
    )


def view(
    reports: dict[int, wire.Report], hosts: list[str] = HOSTS, **kw: object
) -> dict[str, object]:
    scope = kw.pop("scope", mesh.scope_of(len(hosts), "auto", "s"))
    return mesh.view(
        hosts=hosts,
        generation="e.1",
        reports=reports,
        scope=scope,
        excused=kw.pop("excused", lambda r: False),  # type: ignore[arg-type]
        cut=wire.MAX_FAILURES,
    )


def test_a_cut_pair_is_marked_both_ways_and_everything_else_passed() -> None:
    reports = {r: report(r, passed=True) for r in (0, 3)}
    reports[1] = report(1, failures=(cut(1, 2),))
    reports[2] = report(2, failures=(cut(2, 1, "refused"),))
    out = view(reports)
    assert out["matrix"] == ["\\...", ".\\T.", ".R\\.", "...\\"]
    assert out["counts"] == {"passed": 10, "failed": 2, "checking": 0, "unknown": 0, "not_tried": 0}
    assert out["causes"] == {"refused": 1, "timeout": 1}
    failed = [(p["from"], p["to"], p["cause"]) for p in out["pairs"]]  # type: ignore[index, union-attr]
    assert failed == [(1, 2, "timeout"), (2, 1, "refused")]
    assert [n["rank"] for n in out["nodes"]] == [1, 2]  # type: ignore[index, union-attr]
    assert not mesh_ok(out)


def test_a_node_that_has_not_reported_is_not_tried_and_one_without_outcome_is_checking() -> None:
    reports = {0: report(0, passed=True), 1: report(1)}
    out = view(reports)
    assert out["matrix"] == ["\\...", "?\\??", "  \\ ", "   \\"]
    counts = out["counts"]
    assert counts["checking"] == 3 and counts["not_tried"] == 6 and counts["passed"] == 3  # type: ignore[index]
    assert {n["rank"]: n["state"] for n in out["nodes"]} == {  # type: ignore[index, union-attr]
        1: "checking",
        2: "not_reported",
        3: "not_reported",
    }
    assert out["nodes_total"] == 3


def test_a_name_failure_names_its_pair_and_an_own_problem_stays_with_the_node() -> None:
    name = Reason("resolve_failed", "sub2 does not resolve", host="sub2", ranks=(1,))
    clock = Reason("clock_skew", "this node's clock is 9 s off", ranks=(1,))
    reports = {r: report(r, passed=True) for r in (0, 2, 3)}
    reports[1] = report(1, failures=(clock, name))
    out = view(reports)
    assert out["matrix"][1] == ".\\D."  # type: ignore[index]
    node = out["nodes"][0]  # type: ignore[index]
    assert node["state"] == "failed" and node["problems"][0]["code"] == "clock_skew"


def test_a_report_cut_at_its_failure_limit_leaves_the_rest_unknown() -> None:
    hosts = [f"n{i}" for i in range(40)]
    failures = tuple(
        unreachable_reason((0, "n0"), (b, hosts[b], "10.0.0.9"), "probe", 7000, "timeout", "x")
        for b in range(1, wire.MAX_FAILURES + 1)
    )
    reports = {0: wire.Report("s", "e.1", 0, "n0", False, failures)}
    out = view(reports, hosts)
    row = out["matrix"][0]  # type: ignore[index]
    assert row[1 : wire.MAX_FAILURES + 1] == "T" * wire.MAX_FAILURES
    assert set(row[wire.MAX_FAILURES + 1 :]) == {"!"}


def test_an_excused_failure_counts_as_passed() -> None:
    foreign = unreachable_reason(
        (1, "sub1"), (0, "main1", "10.0.0.1"), "master", 29500, "foreign_answer", "x"
    )
    reports = {r: report(r, passed=r != 1) for r in range(4)}
    reports[1] = report(1, failures=(foreign,))
    out = view(reports, excused=lambda r: r.detail == "foreign_answer")
    assert out["matrix"][1] == ".\\.."  # type: ignore[index]
    assert out["counts"]["failed"] == 0  # type: ignore[index]
    assert out["nodes"][0]["state"] == "excused"  # type: ignore[index]


def test_above_the_matrix_limit_only_the_nodes_with_problems_are_listed() -> None:
    n = 200
    hosts = [f"n{i}" for i in range(n)]
    reports = {r: wire.Report("s", "e.1", r, hosts[r], True) for r in range(n) if r != 7}
    bad = unreachable_reason((7, "n7"), (8, "n8", "10.0.0.9"), "probe", 7000, "reset", "x")
    reports[7] = wire.Report("s", "e.1", 7, "n7", False, (bad,))
    scope = mesh.scope_of(n, "auto", "s")
    out = view(reports, hosts, scope=scope)
    assert "matrix" not in out
    assert [(x["rank"], x["failed_pairs"]) for x in out["nodes"]] == [(7, 1)]  # type: ignore[index, union-attr]
    tried = sum(len(scope(r)) - 1 for r in range(n))
    counts = out["counts"]
    assert counts["passed"] + counts["failed"] == tried  # type: ignore[index, operator]
    assert counts["not_tried"] == n * (n - 1) - tried  # type: ignore[index]


def test_links_are_listed_slowest_first() -> None:
    fast, slow = LinkStat(1, 900.0, 910.0), LinkStat(2, 40.0, 800.0)
    reports = {0: report(0, passed=True, links=(fast,)), 3: report(3, passed=True, links=(slow,))}
    links = view(reports)["links"]
    assert [(x["from"], x["to"]) for x in links] == [(3, 2), (0, 1)]  # type: ignore[index, union-attr]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.dictionaries(
                st.integers(0, n - 1),
                st.tuples(st.booleans(), st.sets(st.integers(0, n - 1), max_size=n)),
            ),
        )
    )
)
def test_every_ordered_pair_is_counted_once(
    case: tuple[int, dict[int, tuple[bool, set[int]]]],
) -> None:
    n, spec = case
    hosts = [f"h{i}" for i in range(n)]
    reports = {}
    for rank, (passed, cuts) in spec.items():
        failures = tuple(
            unreachable_reason(
                (rank, hosts[rank]), (b, hosts[b], "10.0.0.1"), "probe", 1, "timeout", "x"
            )
            for b in sorted(cuts - {rank})
        )
        reports[rank] = wire.Report(
            "s", "e.1", rank, hosts[rank], passed and not failures, failures
        )
    out = view(reports, hosts)
    assert sum(out["counts"].values()) == n * (n - 1)  # type: ignore[union-attr, attr-defined]
    marks = "".join(out["matrix"])  # type: ignore[arg-type]
    assert marks.count("T") == out["counts"]["failed"]  # type: ignore[index]
    assert mesh_ok(out) == (len(reports) == n and all(r.passed for r in reports.values()))
    format_mesh(json.loads(json.dumps(out)))  # renders whatever the state


def test_the_rendering_shows_the_matrix_the_legend_and_the_failed_pair() -> None:
    reports = {r: report(r, passed=True) for r in (0, 3)}
    reports[1] = report(1, failures=(cut(1, 2),))
    reports[2] = report(2, failures=(cut(2, 1),))
    text = format_mesh(json.loads(json.dumps(view(reports))))
    lines = text.splitlines()
    assert "4 nodes, 4 reported, 12 ordered pairs" in lines[0]
    assert lines[1].strip() == "10 passed, 2 failed (timeout 2)"
    assert "\n1 sub1     . \\ T .\n" in text
    assert "legend: . passed  T timeout" in text
    assert "  1 -> 2  timeout: sub1 cannot reach sub2 (10.0.0.3) on tcp/7000" in text


def test_the_rendering_stacks_the_digits_of_wide_ranks() -> None:
    hosts = [f"n{i}" for i in range(12)]
    reports = {r: wire.Report("s", "e.1", r, hosts[r], True) for r in range(12)}
    lines = format_mesh(view(reports, hosts)).splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("from \\ to"))
    assert lines[at - 1].rstrip().endswith(" " * 19 + "1 1")  # the tens, blank below 10
    assert lines[at].rstrip().endswith("0 1 2 3 4 5 6 7 8 9 0 1")
    assert lines[at + 1].startswith(" 0 n0")


def test_a_mesh_answer_must_carry_its_counts() -> None:
    assert routes.parse_mesh(json.dumps({"counts": {}, "nnodes": 2}).encode())["nnodes"] == 2
    with pytest.raises(PeerMessageError, match="counts and nnodes"):
        routes.parse_mesh(b'{"nnodes": 2}')
    with pytest.raises(PeerMessageError, match="not JSON"):
        routes.parse_mesh(b"<html>")


def _peer(rank: int, **kw: object) -> dict[str, object]:
    return {
        "rank": rank,
        "host": f"n{rank}",
        "joined": True,
        "verified": True,
        "verdict": "ok",
    } | kw


def test_a_large_cluster_status_counts_the_peers_and_lists_the_problems_only() -> None:
    peers = [_peer(r) for r in range(100)]
    peers[5] = _peer(5, verdict="not_found", detail="no such host")
    peers[9] = _peer(9, joined=False, verdict=None)
    peers[50:] = [_peer(r, verified=False, verdict=None) for r in range(50, 100)]
    doc = {"ready": False, "peers": peers}
    text = format_status(status_view(doc))
    assert (
        "peers: 100 (50 not checked here, 48 ok, 1 failed, 1 not joined); these have a problem"
        in text
    )
    rows = [line.split()[0] for line in text.splitlines() if line[:1].isdigit()]
    assert rows == ["5", "9"]
    every = format_status(status_view(doc), show_all=True)
    assert sum(1 for line in every.splitlines() if line[:1].isdigit()) == 100


def test_a_small_cluster_status_lists_every_peer() -> None:
    text = format_status(status_view({"ready": True, "peers": [_peer(r) for r in range(8)]}))
    assert "peers:" not in text
    assert sum(1 for line in text.splitlines() if line[:1].isdigit()) == 8
