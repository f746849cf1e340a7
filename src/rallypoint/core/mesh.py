"""The mesh: every ordered pair of nodes and how its connection checks went, as the master sees it.

Each node checks the peers in its scope (names.scope_ranks): their names, then every port the
job will dial. Its report to the master says whether all of that passed and, if not, the
failures, each naming its pair. From the reports of the current generation a pair is:

- passed: its node's report passed, or listed failures that are all about other pairs;
- failed, with the short cause of its first failure (timeout, refused, path_mtu, name, ...);
- checking: its node reported no outcome yet (its checks run);
- unknown: its node's report was cut at the failures a report carries (``cut``,
  wire.MAX_FAILURES), so this pair's fate did not fit;
- not tried: its node has not reported, or the pair is outside its node's scope.

A failure the master excuses (the job already listens on a busy window) counts as passed,
as it does in the verdict. Pure: from the book's fields to a JSON-ready dict.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from rallypoint.core import names
from rallypoint.core.links import LinkStat
from rallypoint.reasons import Reason

#: The own problems listed per node (its own name, its clock, ...).
PROBLEMS_SHOWN = 4
#: Up to this many nodes the view carries the whole matrix; above it, the nodes with problems.
MATRIX_MAX_NODES = 64
#: The pairs listed with their message (failed first, then unknown, then checking).
PAIRS_SHOWN = 256
#: The nodes listed above MATRIX_MAX_NODES (those with problems, by rank).
NODES_SHOWN = 256

PASSED, CHECKING, UNKNOWN, NOT_TRIED, SELF = ".", "?", "!", " ", "\\"

#: The one-letter mark of each cause in the matrix; a cause not here is "E".
CAUSE_MARKS = {
    "timeout": "T",
    "refused": "R",
    "reset": "X",
    "no_route": "N",
    "foreign_answer": "F",
    "wrong_peer": "W",
    "path_mtu": "M",
    "stalled": "S",
    "slow": "L",
    "name": "D",
    "error": "E",
}

LEGEND = {
    PASSED: "passed",
    CHECKING: "checking",
    UNKNOWN: "unknown (the report was cut at its failure limit)",
    NOT_TRIED: "not tried",
    SELF: "self",
} | {mark: cause for cause, mark in CAUSE_MARKS.items()}

_STATES = {PASSED: "passed", CHECKING: "checking", UNKNOWN: "unknown", NOT_TRIED: "not_tried"}

Scope = Callable[[int], Sequence[int]]


class Checked(Protocol):
    """What the mesh reads of a node's report (wire.Report)."""

    @property
    def passed(self) -> bool: ...

    @property
    def failures(self) -> Sequence[Reason]: ...

    @property
    def links(self) -> Sequence[LinkStat]: ...


def cause(reason: Reason) -> str:
    """The short cause of a pair's failure: the probe's cause, or ``name`` for its DNS check."""
    if reason.code == "path_mtu":
        return "path_mtu"
    if reason.code == "slow_link":
        return "slow"
    if len(reason.ranks) >= 2:
        return reason.detail or "error"
    return "name"


def view(
    *,
    hosts: Sequence[str],
    generation: str | None,
    reports: Mapping[int, Checked],
    scope: Scope,
    excused: Callable[[Reason], bool],
    cut: int,
) -> dict[str, object]:
    """The mesh of one generation: counts by state, problem pairs and nodes, matrix if small;
    ``cut``: the most failures a report carries (one that long may have left some out)."""
    nnodes = len(hosts)
    rank_of = {host.lower(): rank for rank, host in enumerate(hosts)}
    counts = dict.fromkeys([*_STATES.values(), "failed"], 0)
    causes: dict[str, int] = {}
    pairs: list[tuple[int, dict[str, object]]] = []  # (order, pair)
    nodes: list[dict[str, object]] = []
    rows: list[str] = []
    problems = 0  # nodes whose report did not pass (or that have not reported)
    matrix = nnodes <= MATRIX_MAX_NODES
    for rank in range(nnodes):
        report = reports.get(rank)
        row = _row(rank, report, rank_of, excused, cut)
        failed = row.failed
        # A pair its node failed counts even if this master's scope would not have drawn it.
        peers = sorted({r for r in scope(rank) if r != rank} | failed.keys())
        marks = dict.fromkeys(peers, row.default)
        for to, reason in failed.items():
            short = cause(reason)
            marks[to] = CAUSE_MARKS.get(short, "E")
            causes[short] = causes.get(short, 0) + 1
        pairs += _listed(rank, peers, row, hosts)
        counts["failed"] += len(failed)
        counts[_STATES[row.default]] += len(peers) - len(failed)
        counts["not_tried"] += nnodes - 1 - len(peers)
        problem = report is None or not report.passed
        problems += problem
        if problem and (matrix or len(nodes) < NODES_SHOWN):
            nodes.append(_node(rank, hosts[rank], report, len(failed), row.own))
        if matrix:
            cells = [SELF if to == rank else marks.get(to, NOT_TRIED) for to in range(nnodes)]
            rows.append("".join(cells))
    pairs.sort(key=lambda item: item[0])
    out: dict[str, object] = {
        "generation": generation,
        "nnodes": nnodes,
        "reported": len(reports),
        "counts": counts,
        "causes": dict(sorted(causes.items())),
        "pairs": [pair for _order, pair in pairs[:PAIRS_SHOWN]],
        "pairs_total": len(pairs),
        "nodes": nodes,
        "nodes_total": problems,
    }
    if matrix:
        out["hosts"] = list(hosts)
        out["matrix"] = rows
        out["legend"] = dict(LEGEND)
    out["links"] = _links(reports, hosts)
    return out


class _Row(NamedTuple):
    """One node's row, before the scope: the rest's mark, its failed pairs, its own problems."""

    default: str
    failed: dict[int, Reason]
    own: list[Reason]


def _row(
    rank: int,
    report: Checked | None,
    rank_of: Mapping[str, int],
    excused: Callable[[Reason], bool],
    cut: int,
) -> _Row:
    if report is None:
        return _Row(NOT_TRIED, {}, [])
    if report.passed:
        return _Row(PASSED, {}, [])
    failed: dict[int, Reason] = {}
    own: list[Reason] = []
    for reason in report.failures:
        to = _target(rank, reason, rank_of)
        if to is None:
            own.append(reason)
        elif not excused(reason):
            failed.setdefault(to, reason)  # the first failure of a pair names its cause
    if len(report.failures) >= cut:
        default = UNKNOWN  # more may have failed than the report could carry
    elif report.failures:
        default = PASSED  # its checks ran: what is not listed passed
    else:
        default = CHECKING
    return _Row(default, failed, own)


def _listed(
    rank: int, peers: Sequence[int], row: _Row, hosts: Sequence[str]
) -> list[tuple[int, dict[str, object]]]:
    """A row's pairs to list, each with its order: failed 0, unknown 1, checking 2."""
    listed = [(0, _pair(rank, to, hosts, "failed", reason)) for to, reason in row.failed.items()]
    if row.default in (UNKNOWN, CHECKING):
        order = 1 if row.default == UNKNOWN else 2
        state = _STATES[row.default]
        listed += [
            (order, _pair(rank, to, hosts, state, None)) for to in peers if to not in row.failed
        ]
    return listed


def _target(rank: int, reason: Reason, rank_of: Mapping[str, int]) -> int | None:
    """The peer a failure is about (None: the node itself, as for its own name or clock)."""
    if len(reason.ranks) >= 2 and reason.ranks[0] == rank:
        return reason.ranks[1]
    if reason.host is None:
        return None
    to = rank_of.get(reason.host.lower())
    return None if to is None or to == rank else to


def _pair(
    rank: int, to: int, hosts: Sequence[str], state: str, reason: Reason | None
) -> dict[str, object]:
    pair: dict[str, object] = {
        "from": rank,
        "from_host": hosts[rank],
        "to": to,
        "to_host": hosts[to],
        "state": state,
    }
    if reason is not None:
        pair |= {"cause": cause(reason), "code": reason.code, "message": reason.message}
    return pair


def _node(
    rank: int, host: str, report: Checked | None, failed: int, own: list[Reason]
) -> dict[str, object]:
    if report is None:
        state = "not_reported"
    elif failed or own:
        state = "failed"
    elif report.failures:
        state = "excused"
    else:
        state = "checking"
    return {
        "rank": rank,
        "host": host,
        "state": state,
        "failed_pairs": failed,
        "problems": [r.as_json() for r in own[:PROBLEMS_SHOWN]],
    }


def _links(reports: Mapping[int, Checked], hosts: Sequence[str]) -> list[dict[str, object]]:
    """Each measured link's throughput, slowest first (the first PAIRS_SHOWN)."""
    measured = [
        (min(link.up_mbps, link.down_mbps), rank, link)
        for rank, report in reports.items()
        for link in report.links
        if link.peer < len(hosts)
    ]
    measured.sort(key=lambda item: (item[0], item[1], item[2].peer))
    return [
        {"from": rank, "to": link.peer, "up_mbps": round(link.up_mbps, 1),
         "down_mbps": round(link.down_mbps, 1)}
        for _slowest, rank, link in measured[:PAIRS_SHOWN]
    ]  # fmt: skip


def scope_of(nnodes: int, resolve_scope: str, session: str) -> Scope:
    """The peers each rank checks, as names.scope_ranks draws them (the master's setting)."""
    return lambda rank: names.scope_ranks(nnodes, rank, resolve_scope, seed=session)
