"""The `rallypoint` command group: every command, parsed by click."""

from __future__ import annotations

import click

# asyncio, the local API client, tempfile and secrets are imported inside the commands that
# use them: `check` runs every few seconds as a HEALTHCHECK and needs neither asyncio nor
# tempfile, and `serve` needs no HTTP client before its listeners are up.
from rallypoint.cli import run, serve, status, waiting
from rallypoint.cli.output import Group


@click.group(
    cls=Group,
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": 100,
        "show_default": True,
    },
    epilog="Exit codes: 0 ok, 1 not ready or failed, 2 bad usage or configuration, "
    "3 timed out. RALLYPOINT_TOKEN holds the session secret.",
)
@click.version_option(package_name="rallypoint", prog_name="rallypoint")
def app() -> None:
    """Rendezvous sidecar for multi-node training: agree on the master, check the network,
    serve MASTER_ADDR, MASTER_PORT, WORLD_SIZE, TF_CONFIG ... to the trainer."""


for _command in (
    serve.serve,
    waiting.wait,
    waiting.env,
    waiting.check,
    waiting.exec_,
    run.run,
    serve.derive,
    status.status,
    status.peers,
    serve.demo,
):
    app.add_command(_command)
