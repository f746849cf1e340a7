"""`rallypoint run`: wait like exec, then run the command as a supervised child (docs/run.md)."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from rallypoint.cli import rules, specs, termination
from rallypoint.cli.options import client_options, opt, option, quiet_option, wait_timeout
from rallypoint.cli.output import EXIT_USAGE, Command, exit_code
from rallypoint.cli.progressfile import Bounds
from rallypoint.cli.setup import base_url, setup
from rallypoint.cli.waiting import served_env
from rallypoint.core.jobs import LOST_EXIT_CODE
from rallypoint.errors import RallypointError

#: Seconds between SIGTERM and SIGKILL: long enough for a trainer's exit handlers and a
#: process group's data-loader workers, short against a scheduler's own kill timeout
#: (Slurm's KillWait is 30 s; Kubernetes' terminationGracePeriodSeconds 30 s).
GRACE_S = 10.0
#: Seconds the nodes wait for every node to start the next attempt after a failure: a node
#: lost and coming back needs its container restarted (compose restarts at once; Kubernetes
#: restarts in place after a 10 s, then 20 s back-off), its sidecar ready again (a few
#: seconds) and its `run` started: 60 s covers the first two back-offs with room to spare
#: (docs/run.md "Restarting in place").
REJOIN_TIMEOUT_S = 60
#: The lines that name the first failure (the last one is the run's verdict).
FIRST_LINE = "rallypoint: first failure"


@click.command(
    "run",
    cls=Command,
    # An option run does not know, before the command, is an error at once (exit 2): it
    # must not become the command, found missing only after the wait.
    context_settings={"ignore_unknown_options": False, "allow_interspersed_args": False},
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
@opt(
    "--restarts",
    "Start the job again on every node, as the next attempt, up to N times when an attempt"
    " fails (a crash, a lost node that came back); never after a stop from outside.",
    envvar="RALLYPOINT_RESTARTS",
    rule=rules.Int("N", 0, 1_000_000, "a whole number of restarts: use 0 or more, e.g. 3"),
    default=0,
)
@opt(
    "--rejoin-timeout",
    "Seconds the nodes wait, after a failed attempt, for a lost node to come back and start"
    " the next with them (counted from when every other node is starting).",
    envvar="RALLYPOINT_REJOIN_TIMEOUT",
    rule=rules.Int("S", 0, 86_400, "a whole number of seconds: use 0 or more, e.g. 60"),
    default=REJOIN_TIMEOUT_S,
)
@opt(
    "--stall-timeout",
    "Seconds without progress (the job marks it in RALLYPOINT_PROGRESS_FILE) after which the"
    " job has stalled here: a failure that stops it on every node. Default: off.",
    envvar="RALLYPOINT_STALL_TIMEOUT",
    rule=rules.Seconds(),
)
@opt(
    "--stall-timeout-first",
    "Seconds from the start until the job's first progress (model load, compile) before it"
    " has stalled; set, a job that never marks progress stalls too. Default: off.",
    envvar="RALLYPOINT_STALL_TIMEOUT_FIRST",
    rule=rules.Seconds(),
)
@opt(
    "--stall-timeout-checkpoint",
    "Seconds without progress after a mark whose phase is 'checkpoint' (a long save is not"
    " a hang). Default: --stall-timeout.",
    envvar="RALLYPOINT_STALL_TIMEOUT_CHECKPOINT",
    rule=rules.Seconds(),
)
@opt(
    "--stall-signal",
    "Send this signal (USR1, ...) to a stalled job 3 s before its stop, for its stacks"
    " (faulthandler.register). Default: none.",
    envvar="RALLYPOINT_STALL_SIGNAL",
    rule=rules.SignalName(),
    metavar="SIGNAL",
)
@opt(
    "--termination-log",
    "When the job failed, write its first failure's line here (Kubernetes shows it in the"
    " pod's status); default: /dev/termination-log when it exists.",
    envvar="RALLYPOINT_TERMINATION_LOG",
    metavar="FILE",
)
@option(specs.TOKEN_FILE)
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
    restarts: int,
    rejoin_timeout: int,
    stall_timeout: float | None,
    stall_timeout_first: float | None,
    stall_timeout_checkpoint: float | None,
    stall_signal: int | None,
    termination_log: str | None,
    command: tuple[str, ...],
    **_: Any,
) -> None:
    """Wait until ready, then run COMMAND as a supervised child: stop it when the job fails
    on any node, and exit with a status a scheduler can act on."""
    settings, _environ = setup(ctx)
    try:
        values = served_env(ctx, settings, timeout)
    except RallypointError as exc:
        if exit_code(exc) == EXIT_USAGE:
            raise
        # The job never started here: "try again", not "the job failed" (docs/run.md).
        click.echo(f"error: {exc}; the job was not started: exit {lost_exit_code}", err=True)
        raise click.exceptions.Exit(lost_exit_code) from exc
    from rallypoint.cli.supervisor import Supervisor

    sys.stdout.flush()
    sys.stderr.flush()
    firsts: list[str] = []

    def say(text: str) -> None:
        if text.startswith(FIRST_LINE):
            firsts.append(text)
        click.echo(text, err=True)

    supervisor = Supervisor(
        command,
        {**os.environ, **values},
        url=base_url(ctx, settings),
        proof=_local_proof(settings.token),
        grace_s=grace,
        lost_code=lost_exit_code,
        say=say,
        restarts=restarts,
        rejoin_timeout_s=float(rejoin_timeout),
        start_timeout_s=timeout or None,
        stall=Bounds(stall_timeout, stall_timeout_first, stall_timeout_checkpoint),
        stall_signal=stall_signal,
    )
    status = supervisor.run()
    if status != 0 and firsts:
        termination.write(termination_log, firsts[-1], say)
    raise click.exceptions.Exit(status)


def _local_proof(token: str | None) -> str | None:
    """What proves the session token on the sidecar's writes; None without a token."""
    if token is None:
        return None
    from rallypoint.auth import Authenticator

    return Authenticator(token).local_proof()
