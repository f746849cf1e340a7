"""`rallypoint status --mesh`: the master's pair matrix (core/mesh.py) as a person reads it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rallypoint.cli.output import cell, table

#: Failed pairs listed with their message; the rest are in --json.
PAIRS_SHOWN = 20
#: Measured links listed, slowest first.
LINKS_SHOWN = 16
#: Host names are cut to this in the matrix's row labels.
HOST_WIDTH = 24


def mesh_ok(doc: Mapping[str, Any]) -> bool:
    """Every node reported and passed its checks."""
    nnodes = doc.get("nnodes")
    return doc.get("nodes_total") == 0 and doc.get("reported") == nnodes


def format_mesh(doc: Mapping[str, Any]) -> str:
    """A readable rendering of a /mesh document (the --json form carries everything)."""
    counts = doc.get("counts") if isinstance(doc.get("counts"), dict) else {}
    assert isinstance(counts, dict)
    nnodes = doc.get("nnodes")
    pairs_total = sum(v for v in counts.values() if isinstance(v, int))
    out = [
        f"mesh of generation {doc.get('generation') or '-'}, as the master sees it: "
        f"{nnodes} node{'' if nnodes == 1 else 's'}, {doc.get('reported')} reported, "
        f"{pairs_total} ordered pair{'' if pairs_total == 1 else 's'}",
        "  " + _counts(counts, doc.get("causes")),
    ]
    matrix = doc.get("matrix")
    if isinstance(matrix, list) and matrix:
        out += ["", *_matrix(matrix, doc.get("hosts") or [])]
        legend = _legend(matrix, doc.get("legend") or {})
        if legend:
            out += ["", "legend: " + legend]
    failed = [
        p for p in doc.get("pairs") or () if isinstance(p, dict) and p.get("state") == "failed"
    ]
    if failed:
        out += ["", "failed pairs:"]
        for pair in failed[:PAIRS_SHOWN]:
            out.append(
                f"  {pair.get('from')} -> {pair.get('to')}  {pair.get('cause')}: "
                f"{pair.get('message')}"
            )
        more = int(counts.get("failed", 0)) - min(len(failed), PAIRS_SHOWN)
        if more > 0:
            out.append(f"  and {more} more (--json lists up to {len(doc.get('pairs') or ())})")
    nodes = [n for n in doc.get("nodes") or () if isinstance(n, dict)]
    if nodes:
        rows = [
            [cell(n.get("rank")), cell(n.get("host")), cell(n.get("state")),
             cell(n.get("failed_pairs")), _problem(n)]
            for n in nodes
        ]  # fmt: skip
        out += ["", "nodes with problems:", table(["RANK", "HOST", "STATE", "FAILED", "OWN"], rows)]
        more = int(doc.get("nodes_total") or 0) - len(nodes)
        if more > 0:
            out.append(f"and {more} more nodes with problems")
    links = [link for link in doc.get("links") or () if isinstance(link, dict)]
    if links:
        out += ["", "measured links, slowest first (Mbit/s up / down):"]
        out += [
            f"  {link.get('from')} -> {link.get('to')}  "
            f"{link.get('up_mbps')} / {link.get('down_mbps')}"
            for link in links[:LINKS_SHOWN]
        ]
        if len(links) > LINKS_SHOWN:
            out.append(f"  and {len(links) - LINKS_SHOWN} more (--json)")
    return "\n".join(out)


def _counts(counts: Mapping[str, Any], causes: object) -> str:
    parts = []
    for key in ("passed", "failed", "checking", "unknown", "not_tried"):
        if counts.get(key):
            part = f"{counts[key]} {key.replace('_', ' ')}"
            if key == "failed" and isinstance(causes, dict) and causes:
                part += " (" + ", ".join(f"{c} {n}" for c, n in causes.items()) + ")"
            parts.append(part)
    return ", ".join(parts) or "no pairs"


def _matrix(rows: Sequence[object], hosts: Sequence[object]) -> list[str]:
    """Row labels `rank host`, one column per rank (its digits stacked when wider than one)."""
    n = len(rows)
    digits = len(str(n - 1))
    labels = [
        f"{rank:>{digits}} {str(hosts[rank] if rank < len(hosts) else '')[:HOST_WIDTH]}"
        for rank in range(n)
    ]
    corner = "from \\ to"
    width = max(len(corner), *(len(label) for label in labels))
    header = [
        (corner if d == digits - 1 else "").ljust(width + 2)
        + " ".join(str(rank).rjust(digits)[d] for rank in range(n))
        for d in range(digits)
    ]
    body = [
        f"{label.ljust(width)}  " + " ".join(str(row))
        for label, row in zip(labels, rows, strict=True)
    ]
    return [*header, *body]


def _legend(rows: Sequence[object], legend: Mapping[str, Any]) -> str:
    used = {mark for row in rows for mark in str(row)}
    marks = [m for m in legend if m in used and m != "\\"]
    return "  ".join(f"{'blank' if m == ' ' else m} {legend[m]}" for m in marks)


def _problem(node: Mapping[str, Any]) -> str:
    problems = node.get("problems") or []
    if not problems or not isinstance(problems[0], dict):
        return "-"
    first = problems[0]
    return cell(f"{first.get('code')}: {first.get('message')}")
