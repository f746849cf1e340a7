"""The commands that show what is there: status (this sidecar's view) and peers (mDNS)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from rallypoint.cli import rules
from rallypoint.cli.options import client_options, logging_options, mdns_interfaces, opt
from rallypoint.cli.output import EXIT_FAILED, Command, cell, table
from rallypoint.cli.setup import base_url, setup


@click.command(cls=Command)
@opt(
    "--json",
    "Print the raw /status document.",
    dest="as_json",
    envvar="RALLYPOINT_STATUS_JSON",
    is_flag=True,
    default=False,
)
@client_options
@click.pass_context
def status(ctx: click.Context, /, as_json: bool, **_: Any) -> None:
    """The cluster as this sidecar sees it; exit 1 when not ready."""
    settings, _environ = setup(ctx)
    from rallypoint import client

    doc = client.status(base_url(ctx, settings))
    if as_json:
        click.echo(json.dumps(doc, indent=2, sort_keys=True))
    else:
        click.echo(format_status(doc))
    if not doc.get("ready"):
        raise click.exceptions.Exit(EXIT_FAILED)


_PEER_COLUMNS = ("rank", "host", "joined", "addresses", "tf_port", "verdict", "resolved", "detail")


def format_status(doc: Mapping[str, Any]) -> str:
    """A readable rendering of a /status document (the --json form carries everything)."""
    spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    head: list[tuple[str, object]] = [("ready", bool(doc.get("ready")))]
    head += [(key, doc[key]) for key in ("generation", "role") if key in doc]
    head += [(key, spec[key]) for key in ("provider", "session", "nnodes", "rank", "master")
             if key in spec]  # fmt: skip
    ports = doc.get("ports") if isinstance(doc.get("ports"), dict) else {}
    assert isinstance(ports, dict)
    for name, port in ports.items():
        if isinstance(port, dict):
            skipped = ", ".join(
                f"{s.get('port')} {s.get('reason')}" for s in port.get("skipped", ())
            )
            held = "held" if port.get("held") else "not held"
            port = f"{port.get('port')} ({held}{'; skipped ' + skipped if skipped else ''})"
        head.append((f"{name} port", port))
    auth = doc.get("auth")
    if isinstance(auth, dict):
        head.append(("auth", "on" if auth.get("enabled") else "off"))
    width = max(len(key) for key, _value in head)
    out = [f"{key.ljust(width)}  {cell(value)}" for key, value in head]
    peers = [peer for peer in doc.get("peers") or () if isinstance(peer, dict)]
    if peers:
        columns = [c for c in _PEER_COLUMNS if any(peer.get(c) is not None for peer in peers)]
        rows = [[cell(peer.get(c)) for c in columns] for peer in peers]
        out += ["", table([c.upper() for c in columns], rows)]
    sections = {
        "reasons": [_reason(r) for r in doc.get("reasons") or ()],
        "warnings": [cell(w) for w in doc.get("warnings") or ()],
        "overrides": [_override(o) for o in doc.get("overrides") or ()],
    }
    for title, items in sections.items():
        if items:
            out += ["", f"{title}:"] + [f"  - {item}" for item in items]
    return "\n".join(out)


def _reason(reason: object) -> str:
    if isinstance(reason, dict) and "message" in reason:
        return f"{reason.get('code', '?')}: {reason['message']}"
    return cell(reason)


def _override(item: object) -> str:
    if isinstance(item, dict) and "key" in item:
        derived = item.get("derived")
        return (
            f"{item['key']}={item.get('value')} from {item.get('source')}"
            f" (derived: {'-' if derived is None else derived})"
        )
    return cell(item)


@click.command(cls=Command)
@opt(
    "--seconds",
    "How long to listen.",
    envvar="RALLYPOINT_PEERS_SECONDS",
    rule=rules.Seconds(),
    default=3.0,
)
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
