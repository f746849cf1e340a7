"""The commands that talk to the local sidecar's API: wait, env, check and exec."""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any

import click

from rallypoint.cli.options import (
    client_options,
    format_option,
    opt,
    quiet_option,
    seconds_option,
    wait_timeout,
    where,
)
from rallypoint.cli.output import Command, Unwritable, check_writable, emit, write_atomic_all
from rallypoint.cli.setup import base_url, setup
from rallypoint.errors import ConfigError, RallypointError
from rallypoint.settings import Settings

if TYPE_CHECKING:
    from rallypoint.cli.progress import Progress

log = logging.getLogger(__name__)


@click.command(cls=Command)
@wait_timeout
@opt(
    "--out",
    "Write the env to FILE atomically (mode 0644), not stdout.",
    envvar="RALLYPOINT_WAIT_OUT",
    metavar="FILE",
)
@opt(
    "--hostfile",
    "Also write the hostfile (host slots=N per node, rank order) to FILE atomically.",
    envvar="RALLYPOINT_WAIT_HOSTFILE",
    metavar="FILE",
)
@format_option
@quiet_option
@client_options
@click.pass_context
def wait(
    ctx: click.Context,
    /,
    timeout: float,
    out: str | None,
    hostfile: str | None,
    fmt: str,
    **_: Any,
) -> None:
    """Block until the local sidecar is ready, then print or write the env (and hostfile)."""
    settings, _environ = setup(ctx)
    targets = {
        name: (path, where(ctx, name, f"--{name}", envvar))
        for name, path, envvar in (
            ("out", out, "RALLYPOINT_WAIT_OUT"),
            ("hostfile", hostfile, "RALLYPOINT_WAIT_HOSTFILE"),
        )
        if path is not None
    }
    # Refuse an unwritable path before waiting minutes for the rendezvous.
    for path, at in targets.values():
        check_writable(path, at)
    body = _wait(ctx, settings, fmt, timeout)
    files: list[tuple[str, str, str]] = []
    if hostfile is not None:
        from rallypoint.cli import client

        text = client.fetch_hostfile(base_url(ctx, settings), wait_s=min(timeout or 30.0, 30.0))
        files.append((hostfile, text, targets["hostfile"][1]))
    if out is None:
        emit(body)
    else:
        files.append((out, body if body.endswith("\n") else body + "\n", targets["out"][1]))
    try:
        write_atomic_all([(path, text) for path, text, _where_ in files])
    except Unwritable as exc:
        at = next(w for path, _text, w in files if path == exc.path)
        raise ConfigError(
            f"{at} {exc.path!r} cannot be written ({exc.reason}): "
            "check that its directory exists and is writable; nothing was written"
        ) from exc
    for path, _text, at in files:
        log.info("file.written", extra={"path": path, "option": at})


def _wait(ctx: click.Context, settings: Settings, fmt: str, timeout: float) -> str:
    from rallypoint.cli import client

    url = base_url(ctx, settings)
    progress = None if ctx.params.get("quiet") else _progress(settings, url)
    try:
        body = client.wait_env(
            url,
            fmt,
            timeout or None,
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=min(settings.backoff_max_s, 1.0),
            # Shorter long-polls only so the lines can follow the state; quiet waits keep 30s.
            poll_s=client.POLL_S if progress is None else progress.poll_s,
            watch=progress,
        )
    except BaseException:
        if progress is not None:
            progress.stop()
        raise
    if progress is not None:
        progress.ready()
    return body


def served_env(ctx: click.Context, settings: Settings, timeout: float) -> dict[str, str]:
    """Wait until ready, then the env as a dict (what exec and run merge into the child's)."""
    from rallypoint.cli import client

    return client.env_values(_wait(ctx, settings, "json", timeout))


def _progress(settings: Settings, url: str) -> Progress:
    import shutil

    from rallypoint.cli import client, progress

    def fetch_status() -> dict[str, object] | None:
        try:
            return client.status_document(url, timeout_s=2.0)
        except RallypointError:
            return None  # progress is best effort: the wait itself reports what matters

    def write(text: str) -> None:
        click.echo(text, err=True, nl=False)

    screen: progress.Screen
    if settings.log_format == "json":
        screen = progress.Events()
    elif sys.stderr.isatty():
        screen = progress.Terminal(write, lambda: shutil.get_terminal_size().columns)
    else:
        screen = progress.Lines(write)
    return progress.Progress(screen, fetch_status)


@click.command(cls=Command)
@format_option
@client_options
@click.pass_context
def env(ctx: click.Context, /, fmt: str, **_: Any) -> None:
    """Print the env now; exit 1 with the reasons when the sidecar is not ready."""
    settings, _environ = setup(ctx)
    from rallypoint.cli import client

    emit(client.fetch_env(base_url(ctx, settings), fmt))


@click.command(cls=Command)
@seconds_option("--timeout", "Seconds to wait for the answer.", "RALLYPOINT_CHECK_TIMEOUT", 2.0)
@client_options
@click.pass_context
def check(ctx: click.Context, /, timeout: float, **_: Any) -> None:
    """Exit 0 when the local sidecar is ready, 1 otherwise (a HEALTHCHECK without curl)."""
    settings, _environ = setup(ctx)
    from rallypoint.cli import client

    client.readyz(base_url(ctx, settings), timeout_s=timeout)


@click.command(
    "exec",
    cls=Command,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@wait_timeout
@quiet_option
@client_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx: click.Context, /, timeout: float, command: tuple[str, ...], **_: Any) -> None:
    """Wait until ready, then run COMMAND with the env merged into its environment."""
    settings, _environ = setup(ctx)
    values = served_env(ctx, settings, timeout)
    merged = {**os.environ, **values}
    log.debug("exec", extra={"command": command[0], "keys": ",".join(values)})
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), merged)
    except FileNotFoundError:
        # 127 / 126 as env(1), timeout(1) and docker use them.
        click.echo(f"error: {command[0]!r} not found: check the command and PATH", err=True)
        raise click.exceptions.Exit(127) from None
    except OSError as exc:
        click.echo(
            f"error: cannot run {command[0]!r}: {exc.strerror or exc}:"
            " check that it is an executable file",
            err=True,
        )
        raise click.exceptions.Exit(126) from None
