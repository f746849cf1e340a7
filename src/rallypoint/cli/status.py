"""The commands that show what is there: status (this sidecar's view) and peers (mDNS)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

import click
import msgspec

from rallypoint.cli.options import (
    client_options,
    logging_options,
    mdns_interfaces,
    opt,
    seconds_option,
)
from rallypoint.cli.output import EXIT_FAILED, Command, cell, table
from rallypoint.cli.setup import base_url, setup
from rallypoint.core.jobs import JobStatus
from rallypoint.reasons import Reason
from rallypoint.wire.jobstates import JobView, ProgressView, ShownMark, ShownState
from rallypoint.wire.local import StatusView

#: Above this many peers the table lists only those with problems (and counts the rest).
SUMMARY_ABOVE = 64


@click.command(cls=Command)
@opt(
    "--json",
    "Print the raw /status document.",
    dest="as_json",
    envvar="RALLYPOINT_STATUS_JSON",
    is_flag=True,
    default=False,
)
@opt(
    "--explain",
    "Also say why a verdict that is no problem here is fine (DETAIL column).",
    is_flag=True,
    default=False,
)
@opt(
    "--mesh",
    "Show the pair matrix of the connection checks (the master's view; "
    "any node asks the master); exit 1 unless every node passed.",
    envvar="RALLYPOINT_STATUS_MESH",
    is_flag=True,
    default=False,
)
@opt(
    "--all",
    f"List every peer, also above {SUMMARY_ABOVE} nodes (where only problems are listed).",
    dest="show_all",
    envvar="RALLYPOINT_STATUS_ALL",
    is_flag=True,
    default=False,
)
@client_options
@click.pass_context
def status(
    ctx: click.Context, /, as_json: bool, explain: bool, mesh: bool, show_all: bool, **_: Any
) -> None:
    """The cluster as this sidecar sees it; exit 1 when not ready."""
    settings, _environ = setup(ctx)
    from rallypoint.cli import client

    if mesh:
        from rallypoint.cli.meshview import format_mesh, mesh_ok

        view = client.mesh(base_url(ctx, settings))
        click.echo(json.dumps(view, indent=2, sort_keys=True) if as_json else format_mesh(view))
        if not mesh_ok(view):
            raise click.exceptions.Exit(EXIT_FAILED)
        return
    if as_json:  # the whole document, every section as the sidecar wrote it
        doc = client.status_document(base_url(ctx, settings))
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
        ready = doc.get("ready") is True
    else:
        shown = client.status(base_url(ctx, settings))
        click.echo(format_status(shown, explain=explain, show_all=show_all))
        ready = shown.ready
    if not ready:
        raise click.exceptions.Exit(EXIT_FAILED)


_PEER_COLUMNS = ("rank", "host", "joined", "addresses", "tf_port", "verdict", "resolved", "detail")


def format_status(doc: StatusView, *, explain: bool = False, show_all: bool = False) -> str:
    """A readable rendering of GET /status (the --json form carries everything).

    A verdict the sidecar excused (no problem on this node) reads `VERDICT (fine)`; with
    ``explain`` its detail (what the lookup found, no remedy: /status leaves it out) and
    why it is fine. Above
    SUMMARY_ABOVE peers the table lists the peers with problems only, unless ``show_all``.
    """
    head: list[tuple[str, object]] = [("ready", doc.ready)]
    head += [(key, value) for key, value in (("generation", doc.generation), ("role", doc.role))
             if value is not msgspec.UNSET]  # fmt: skip
    if not isinstance(doc.spec, msgspec.UnsetType):
        head += [(key, getattr(doc.spec, key))
                 for key in ("provider", "session", "nnodes", "rank", "master")]  # fmt: skip
    for name, port in doc.ports.items():
        if isinstance(port, dict):
            skipped = ", ".join(
                f"{s.get('port')} {s.get('reason')}" for s in port.get("skipped", ())
            )
            held = "held" if port.get("held") else "not held"
            port = f"{port.get('port')} ({held}{'; skipped ' + skipped if skipped else ''})"
        head.append((f"{name} port", port))
    if doc.auth:
        head.append(("auth", "on" if doc.auth.get("enabled") else "off"))
    width = max(len(key) for key, _value in head)
    out = [f"{key.ljust(width)}  {cell(value)}" for key, value in head]
    peers = list(doc.peers)
    if len(peers) > SUMMARY_ABOVE and not show_all:
        peers_all, counts = peers, Counter(peer_state(p) for p in peers)
        said = ", ".join(f"{n} {state}" for state, n in sorted(counts.items(), key=_by_count))
        peers = [p for p in peers if peer_state(p) in PROBLEM_STATES]
        which = "these have" if peers else "none has"
        out += ["", f"peers: {len(peers_all)} ({said}); {which} a problem (--all lists all)"]
    peers = [_excused(p, explain) for p in peers]
    if peers:
        columns = [c for c in _PEER_COLUMNS if any(peer.get(c) is not None for peer in peers)]
        rows = [[cell(peer.get(c)) for c in columns] for peer in peers]
        out += ["", table([c.upper() for c in columns], rows)]
    sections = {
        "reasons": [_reason(r) for r in doc.reasons],
        "warnings": [cell(w) for w in doc.warnings],
        "left": [_left(x) for x in doc.liveness.get("left") or () if isinstance(x, dict)],
        "overrides": [_override(o) for o in doc.overrides],
    }
    for title, items in sections.items():
        if items:
            out += ["", f"{title}:"] + [f"  - {item}" for item in items]
    if doc.job is not None:
        out += job_lines(doc.job, show_all=show_all)
    return "\n".join(out)


def job_lines(view: JobView, *, show_all: bool = False) -> list[str]:
    """The supervised job (`rallypoint run`): the first failure, counts, then node by node."""
    started = {k: v for k, v in view.counts.items() if k != JobStatus.WAITING and v}
    if not started and view.first is None:
        return []  # no node runs its job under `rallypoint run` (yet)
    said = ", ".join(f"{n} {state}" for state, n in sorted(started.items(), key=_by_count))
    waiting = view.counts.get(JobStatus.WAITING)
    which = f"attempt {view.attempt}: " if view.attempt > 0 else ""
    out = ["", f"job: {which}{said}" + (f", {waiting} not started" if waiting else "")]
    if view.first is not None:
        out.append(f"  first failure: {_failure(view.first)}")
    for failed in view.attempts:
        if failed.attempt != view.attempt:
            out.append(f"  attempt {failed.attempt}: first failure {_failure(failed)}")
    marks: dict[int, ShownMark] = {}
    if view.progress is not None:
        out += _progress_lines(view.progress)
        marks = {m.rank: m for m in view.progress.nodes}
    nodes = list(view.nodes)
    if not show_all and len(nodes) > SUMMARY_ABOVE:
        nodes = [n for n in nodes if n.state != JobStatus.RUNNING]
    for n in nodes:
        out.append(f"  - {_who(n)}: {n.what}{_mark(marks.get(n.rank))}")
    return out


def _progress_lines(progress: ProgressView) -> list[str]:
    """The cluster's progress: how many nodes marked, the oldest and newest, who is behind."""
    if not progress.marked or not progress.oldest:
        return []
    slowest, newest = progress.oldest[0], progress.newest
    line = f"  progress: {progress.marked} nodes marked; oldest {_who(slowest)}{_mark(slowest)}"
    if newest is not None and newest != slowest:
        line += f"; newest {_who(newest)}{_mark(newest)}"
    return [line] + ([f"  {progress.behind}"] if progress.behind else [])


def _who(node: ShownMark | ShownState | Mapping[str, Any]) -> str:
    if isinstance(node, Mapping):
        return f"{node.get('host')} (rank {node.get('rank')})"
    return f"{node.host} (rank {node.rank})"


def _mark(mark: ShownMark | None) -> str:
    """ ", step 1234 (data), 0.4 s ago" for a node's last progress ("" without one)."""
    return "" if mark is None else f", {mark.where}, {mark.age_s:.1f} s ago"


def _left(node: Mapping[str, Any]) -> str:
    """sub3 (rank 3) said goodbye 20 s ago (its sidecar stopped on purpose)."""
    for_s = node.get("for_s")
    ago = f" {for_s:.0f} s ago" if isinstance(for_s, int | float) else ""
    return f"{_who(node)} said goodbye{ago} (its sidecar stopped on purpose; not down)"


def _failure(first: ShownState) -> str:
    """sub2 (rank 2) exited 3, 4.2 s ago."""
    when = "" if first.ago is None else f", {first.ago:.1f} s ago"
    return f"{_who(first)} {first.what}{when}"


#: The peer states that are a problem: the summary lists these peers.
PROBLEM_STATES = frozenset({"not joined", "checking", "failed"})


def peer_state(peer: Mapping[str, Any]) -> str:
    """One peer row's state for the summary: ok, fine, not checked here, or a problem."""
    if not peer.get("joined"):
        return "not joined"
    if peer.get("verified") is False:
        return "not checked here"  # outside this node's scope (names.scope_ranks)
    verdict = peer.get("verdict")
    if verdict is None:
        return "checking"
    if verdict == "ok":
        return "ok"
    return "fine" if peer.get("excused") else "failed"


def _by_count(item: tuple[str, int]) -> tuple[int, str]:
    return (-item[1], item[0])


def _excused(peer: dict[str, Any], explain: bool) -> dict[str, Any]:
    """A peer row whose excused verdict reads as fine: what and why only with ``explain``."""
    excused = peer.get("excused")
    if not excused:
        return peer
    detail = f"{peer['detail']}; fine: {excused}" if peer.get("detail") else f"fine: {excused}"
    verdict = f"{peer.get('verdict')} (fine)"
    return {**peer, "verdict": verdict, "detail": detail if explain else None}


def _reason(reason: Reason) -> str:
    return f"{reason.code}: {reason.message}"


def _override(item: object) -> str:
    if isinstance(item, dict) and "key" in item:
        derived = item.get("derived")
        return (
            f"{item['key']}={item.get('value')} from {item.get('source')}"
            f" (derived: {'-' if derived is None else derived})"
        )
    return cell(item)


@click.command(cls=Command)
@seconds_option("--seconds", "How long to listen.", "RALLYPOINT_PEERS_SECONDS", 3.0)
@mdns_interfaces
@opt(
    "--json",
    "Print JSON instead of a table.",
    dest="as_json",
    envvar="RALLYPOINT_PEERS_JSON",
    is_flag=True,
    default=False,
)
@logging_options
@click.pass_context
def peers(ctx: click.Context, /, seconds: float, as_json: bool, **_: Any) -> None:
    """List the rallypoint sidecars announcing themselves over mDNS, any session."""
    settings, _environ = setup(ctx)
    import asyncio

    from rallypoint.mdns.browse import browse

    seen = asyncio.run(browse(seconds, interfaces=settings.mdns_interfaces))
    columns = ("session", "rank", "host", "addresses", "peer_port", "generation", "instance")
    docs = [{c: getattr(a, c) for c in columns} for a in seen]
    if as_json:
        click.echo(json.dumps(docs, indent=2, default=list))
    elif docs:
        docs.sort(key=lambda d: (str(d["session"]), int(d["rank"])))
        click.echo(
            table([c.upper() for c in columns], [[cell(d[c]) for c in columns] for d in docs])
        )
    else:
        click.echo(f"no rallypoint announcement seen in {seconds:g}s", err=True)
