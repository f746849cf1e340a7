"""What the CLI prints and how it exits: `error: ...` lines, exit codes, tables, atomic files.

Exit codes: 0 ok, 1 not ready or failed, 2 bad usage or configuration, 3 timed out.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from rallypoint.cli.logs import one_line
from rallypoint.errors import ConfigError, RallypointError, RendezvousTimeout

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


def exit_code(exc: BaseException) -> int:
    """The exit code an exception ends the process with."""
    if isinstance(exc, ConfigError):
        return EXIT_USAGE
    if isinstance(exc, RendezvousTimeout):
        return EXIT_TIMEOUT
    return EXIT_FAILED


class Command(click.Command):
    """Maps exceptions raised by a command to `error: ...` and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            raise click.exceptions.Exit(report(exc, ctx.params.get("verbose", False))) from exc


def report(exc: Exception, verbose: bool) -> int:
    """Print a command's failure as `error: ...` (after the traceback when verbose); its code."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, RallypointError):
        message = str(exc)
    else:
        message = f"unexpected {type(exc).__name__}: {exc} (rerun with --verbose for the traceback)"
    click.echo(f"error: {one_line(message)}", err=True)
    return exit_code(exc)


# Raised by click >= 8.2 when the group runs without a command; older clicks print the help.
_NoArgsIsHelp: type[click.UsageError] | tuple[()] = getattr(
    click.exceptions, "NoArgsIsHelpError", ()
)


class Group(click.Group):
    """Prints click's usage errors as one `error: ...` line; exits with the command's code."""

    command_class = Command

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else EXIT_OK
        except _NoArgsIsHelp as exc:
            click.echo(exc.format_message(), err=True)  # `rallypoint` alone: the help
            code = exc.exit_code
        except click.BadParameter as exc:
            hint = exc.param_hint if isinstance(exc.param_hint, str) else None
            if hint is None and exc.param is not None:
                hint = exc.param.get_error_hint(exc.ctx)
            if isinstance(exc, click.MissingParameter) or not hint:
                text = _with_help(exc)
            else:
                text = f"{hint}: {exc.message}"
            code = _fail(text, exc.exit_code)
        except click.UsageError as exc:
            code = _fail(_with_help(exc), exc.exit_code)
        except click.ClickException as exc:
            code = _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            code = _fail("interrupted", EXIT_INTERRUPTED)
        if standalone_mode:
            sys.exit(code)
        return code


def _with_help(exc: click.UsageError) -> str:
    """A usage error with one remedy: click's own suggestion when it makes one, else --help."""
    message = exc.format_message()
    if "Did you mean" in message:
        return message
    return f"{message} (see `{_command_path(exc)} --help`)"


def _command_path(exc: click.UsageError) -> str:
    return exc.ctx.command_path if exc.ctx else "rallypoint"


def _fail(message: str, code: int) -> int:
    click.echo(f"error: {one_line(message)}", err=True)
    return code


# --- output helpers ----------------------------------------------------------------------


class Unwritable(Exception):
    """A file of write_atomic_all could not be staged; nothing was replaced."""

    def __init__(self, path: str, error: OSError) -> None:
        super().__init__(f"{path}: {error}")
        self.path = path
        self.error = error
        self.reason = error.strerror or str(error)


def write_atomic_all(
    files: Sequence[tuple[str | os.PathLike[str], str]], mode: int = 0o644
) -> None:
    """Replace every path with its text: all are staged first, so one failure writes none.

    Each file is written to a temporary file beside it, synced, then renamed over the
    target, so a reader sees the old file or the new, never half. Unwritable names the
    path that could not be staged.
    """
    import tempfile

    staged: list[tuple[Path, str]] = []
    try:
        for path, text in files:
            target = Path(path)
            try:
                fd, tmp = tempfile.mkstemp(
                    prefix=f".{target.name}.", suffix=".tmp", dir=target.parent
                )
                staged.append((target, tmp))
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.chmod(tmp, mode)
            except OSError as exc:
                raise Unwritable(os.fspath(path), exc) from exc
        for target, tmp in staged:
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise Unwritable(os.fspath(target), exc) from exc
    except BaseException:
        for _target, tmp in staged:
            Path(tmp).unlink(missing_ok=True)
        raise
    # Persist the renames themselves, so a crash right after cannot resurrect an old file.
    for directory in dict.fromkeys(target.parent for target, _tmp in staged):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def emit(text: str) -> None:
    click.echo(text, nl=not text.endswith("\n"))


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list | tuple):
        return ",".join(cell(item) for item in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    return str(value)


def check_writable(path: str, where: str) -> None:
    """ConfigError naming the option when ``path`` cannot become a file."""
    target = Path(path)
    directory = target.parent
    problem = None
    if not path.strip():
        problem = "empty path"
    elif target.is_dir():
        problem = "it is a directory"
    elif not directory.is_dir():
        problem = f"no directory {str(directory)!r}"
    elif not os.access(directory, os.W_OK | os.X_OK):
        problem = f"directory {str(directory)!r} is not writable"
    if problem is not None:
        raise ConfigError(
            f"{where} {path!r} cannot be written ({problem}): "
            "check that its directory exists and is writable"
        )
