"""The commands that run or preview the sidecar: serve, derive and demo."""

from __future__ import annotations

import logging
import time
from typing import Any

import click

from rallypoint.cli import rules
from rallypoint.cli.logs import one_line
from rallypoint.cli.options import format_option, opt, settings_options
from rallypoint.cli.output import Command, emit
from rallypoint.cli.setup import setup
from rallypoint.errors import ConfigError
from rallypoint.settings import Settings


@click.command(cls=Command)
@settings_options
@click.pass_context
def serve(ctx: click.Context, /, **_: Any) -> None:
    """Run the sidecar until SIGTERM or SIGINT."""
    run_sidecar(*setup(ctx))


def run_sidecar(settings: Settings, environ: dict[str, str]) -> None:
    """What `serve` does once it has its Settings: run the sidecar until a signal stops it."""
    import asyncio

    from rallypoint import sidecar

    asyncio.run(sidecar.run(settings, environ))


@click.command(cls=Command)
@format_option
@settings_options
@click.pass_context
def derive(ctx: click.Context, /, fmt: str, **_: Any) -> None:
    """Offline: print what this environment would produce, without any network."""
    settings, environ = setup(ctx)
    from rallypoint import providers
    from rallypoint.served import derive as derivation
    from rallypoint.served import render

    spec = providers.detect(environ, settings.provider)
    user = derivation.user_values(environ, settings.sets)
    result = derivation.derive(spec, None, settings.derive_options(user))
    try:
        emit(render.render(result.as_dict(), fmt))
    except ValueError as exc:
        raise ConfigError(f"--format {fmt}: {exc}") from exc
    for override in result.overrides:
        click.echo(
            f"note: {override.key} comes from {override.source}"
            f" (derived: {override.derived or '-'})",
            err=True,
        )
    for warning in result.warnings:
        click.echo(f"warning: {one_line(warning)}", err=True)
    if not result.reserved:
        shown = [f"MASTER_PORT={result.get('MASTER_PORT')}"] if result.get("MASTER_PORT") else []
        shown += [f"TF worker port {settings.tf_port}"] if result.get("TF_CONFIG") else []
        if result.get("JAX_COORDINATOR_ADDRESS"):
            shown += [f"JAX coordinator port {settings.jax_port}"]
        click.echo(
            f"note: ports are preferred, not reserved ({', '.join(shown) or 'none shown'}): "
            "`rallypoint serve` reserves them and takes the next free one when one is taken",
            err=True,
        )


@click.command(cls=Command)
@opt(
    "--nodes",
    "How many sidecars to run on this machine.",
    envvar="RALLYPOINT_DEMO_NODES",
    rule=rules.Int("N", 1, 64, "a node count: use an integer 1-64"),
    default=3,
)
@settings_options
@click.pass_context
def demo(ctx: click.Context, /, nodes: int, **_: Any) -> None:
    """Run N sidecars on loopback and print each node's env and time to ready."""
    settings, _environ = setup(ctx)
    import asyncio
    import secrets

    import msgspec

    from rallypoint.cli import demo as demonstration

    if settings.token is None:
        # Sign the demo's peer traffic with a throwaway secret: it shows the real setup.
        settings = msgspec.structs.replace(settings, token=secrets.token_urlsafe(24))
    if not settings.verbose:
        logging.getLogger("rallypoint").setLevel(logging.WARNING)  # stdout tells the story

    started = time.monotonic()
    results = asyncio.run(demonstration.run(nodes, settings))
    for rank, node_env, seconds in sorted(results, key=lambda item: item[0]):
        compact = " ".join(
            f"{k}={v}"
            for k, v in node_env.values
            if not k.startswith("PET_") and k != "RALLYPOINT_GENERATION"
        )
        click.echo(f"node {rank}: ready in {seconds:.3f}s  {compact}")
    click.echo(f"{len(results)} nodes ready in {time.monotonic() - started:.3f}s")
