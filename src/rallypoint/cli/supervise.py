"""`rallypoint run`: wait like exec, then run the command as a supervised child (docs/run.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from rallypoint.cli import rules
from rallypoint.cli.options import client_options, opt, quiet_option, wait_timeout
from rallypoint.cli.output import Command
from rallypoint.cli.setup import base_url, setup
from rallypoint.cli.waiting import served_env
from rallypoint.core.jobs import LOST_EXIT_CODE

#: Seconds between SIGTERM and SIGKILL: long enough for a trainer's exit handlers and a
#: process group's data-loader workers, short against a scheduler's own kill timeout
#: (Slurm's KillWait is 30 s; Kubernetes' terminationGracePeriodSeconds 30 s).
GRACE_S = 10.0


@click.command(
    "run",
    cls=Command,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@wait_timeout
@opt(
    "--grace",
    "Seconds between SIGTERM and SIGKILL when the job is stopped.",
    envvar="RALLYPOINT_GRACE",
    rule=rules.Seconds(allow_zero=True),
    default=GRACE_S,
)
@opt(
    "--lost-exit-code",
    "Exit status when a node was lost (or stopped from outside): the one to requeue on.",
    envvar="RALLYPOINT_LOST_EXIT_CODE",
    rule=rules.Int("N", 1, 255, "an exit status: use an integer 1-255"),
    default=LOST_EXIT_CODE,
)
@quiet_option
@client_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(
    ctx: click.Context,
    /,
    timeout: float,
    grace: float,
    lost_exit_code: int,
    command: tuple[str, ...],
    **_: Any,
) -> None:
    """Wait until ready, then run COMMAND as a supervised child: stop it when the job fails
    on any node, and exit with a status a scheduler can act on."""
    settings, _environ = setup(ctx)
    values = served_env(ctx, settings, timeout)
    from rallypoint.cli.supervisor import Supervisor

    sys.stdout.flush()
    sys.stderr.flush()
    supervisor = Supervisor(
        command,
        {**os.environ, **values},
        url=base_url(ctx, settings),
        grace_s=grace,
        lost_code=lost_exit_code,
        say=lambda text: click.echo(text, err=True),
    )
    raise click.exceptions.Exit(supervisor.run())
