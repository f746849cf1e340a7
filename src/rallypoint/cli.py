"""The `rallypoint` command: flags and RALLYPOINT_* variables in, exit codes out.

The only module that reads os.environ, imports click, configures logging handlers and
maps exceptions to exit codes (0 ok, 1 not ready or failed, 2 bad usage or
configuration, 3 timed out). Everything else receives a frozen Settings and a mapping.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

# asyncio, the local API client, tempfile and secrets are imported inside the commands that
# use them: `check` runs every few seconds as a HEALTHCHECK and needs neither asyncio nor
# tempfile, and `serve` needs no HTTP client before its listeners are up.
from rallypoint.errors import ConfigError, RallypointError, RendezvousTimeout, SidecarError
from rallypoint.model import DeriveOptions
from rallypoint.settings import Settings

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 0, 1, 2, 3
FORMATS = ("json", "sh", "dotenv")  # render.FORMATS, repeated so --help needs no import
_DEFAULTS = Settings()
_F = TypeVar("_F", bound=Callable[..., Any])

if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]  # generic in the click the type checker sees
else:
    _ParamType = click.ParamType


# --- option types: every bad value fails with the value and the remedy ------------------


class _Option(click.Option):
    """An option whose errors name the flag or the variable the bad value came from."""

    def consume_value(
        self, ctx: click.Context, opts: Mapping[str, Any]
    ) -> tuple[Any, ParameterSource]:
        value, source = super().consume_value(ctx, opts)
        ctx.meta[f"rallypoint.source.{self.name}"] = source
        return value, source

    def get_error_hint(self, ctx: click.Context | None) -> str:
        source = ctx.meta.get(f"rallypoint.source.{self.name}") if ctx else None
        if source is ParameterSource.ENVIRONMENT and isinstance(self.envvar, str):
            return self.envvar
        return " / ".join(self.opts + self.secondary_opts)


def _where(ctx: click.Context, name: str, flag: str, envvar: str) -> str:
    """The flag or variable a parameter's value came from, for messages."""
    source = ctx.get_parameter_source(name)
    return envvar if source is ParameterSource.ENVIRONMENT else flag


_UINT = re.compile(r"[0-9]+")


class _Int(_ParamType):
    """An integer in [low, high]."""

    def __init__(self, name: str, low: int, high: int, remedy: str) -> None:
        self.name, self.low, self.high, self.remedy = name, low, high, remedy

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if not _UINT.fullmatch(text) or not self.low <= int(text) <= self.high:
            self.fail(f"{value!r} is not {self.remedy}", param, ctx)
        return int(text)


class _Seconds(_ParamType):
    """A finite number of seconds, > 0 (or >= 0 when zero means something)."""

    name = "seconds"

    def __init__(self, allow_zero: bool = False) -> None:
        self.allow_zero = allow_zero

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.allow_zero):
            least = "0 or more" if self.allow_zero else "more than 0"
            self.fail(f"{value!r} is not a number of seconds: use {least}, e.g. 30", param, ctx)
        return seconds


class _PortRange(_ParamType):
    """LO-HI, two ports with LO <= HI."""

    name = "LO-HI"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[int, int]:
        if isinstance(value, tuple):
            return (int(value[0]), int(value[1]))
        match = re.fullmatch(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*", str(value))
        if match:
            low, high = int(match[1]), int(match[2])
            if 1 <= low <= high <= 65535:
                return (low, high)
        self.fail(
            f"{value!r} is not a port range: use LO-HI with 1 <= LO <= HI <= 65535, "
            "e.g. 20000-29999",
            param,
            ctx,
        )


class _Choice(_ParamType):
    """One of a fixed set of words."""

    def __init__(self, choices: Sequence[str]) -> None:
        self.choices = tuple(choices)
        self.name = "|".join(self.choices)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return f"[{self.name}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip().lower()
        if text not in self.choices:
            self.fail(f"{value!r} is not one of {', '.join(self.choices)}", param, ctx)
        return text


class _Words(_ParamType):
    """A comma-separated list; with `multiple`, the option may also be repeated."""

    envvar_list_splitter = None

    def __init__(self, name: str, choices: Sequence[str] | None = None) -> None:
        self.name, self.choices = name, choices

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return [rv]  # one variable holds the whole comma list

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, ...]:
        if isinstance(value, tuple):
            return value
        words = tuple(word.strip() for word in str(value).split(",") if word.strip())
        for word in words:
            if any(ch.isspace() for ch in word):
                self.fail(f"{value!r} contains {word!r}: separate items by commas", param, ctx)
            if self.choices is not None and word not in self.choices:
                self.fail(
                    f"{value!r}: {word!r} is not one of {', '.join(self.choices)}", param, ctx
                )
        if not words:
            self.fail(f"{value!r} names nothing: give a comma-separated list", param, ctx)
        return words


class _KeyValue(_ParamType):
    """KEY=VALUE; in the variable, one assignment per line (values may contain spaces)."""

    name = "KEY=VALUE"

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return [line for line in rv.splitlines() if line.strip()]

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return (str(value[0]), str(value[1]))
        key, sep, val = str(value).partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not KEY=VALUE: write e.g. --set MASTER_PORT=29600", param, ctx)
        return (key.strip(), val)


class _TFLayout(_ParamType):
    """A TF_CONFIG layout, as tfconfig.parse_layout reads it."""

    name = "workers|chief|evaluator|ps:N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from rallypoint import tfconfig

        text = str(value).strip().lower()
        try:
            tfconfig.parse_layout(text)
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)
        return text


class _Provider(_ParamType):
    """A provider name from providers.NAMES."""

    name = "provider"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from rallypoint import providers

        text = str(value).strip().lower()
        if text not in providers.NAMES:
            self.fail(
                f"{value!r} is not a provider: use one of {', '.join(providers.NAMES)} "
                "(or leave it unset to detect)",
                param,
                ctx,
            )
        return text


_PORT = _Int("port", 1, 65535, "a port number: use an integer 1-65535")
_S = _DEFAULTS


def _opt(decl: str, help: str, *, dest: str | None = None, **kwargs: Any) -> Callable[[_F], _F]:
    """An option whose RALLYPOINT_* variable (from its flag unless given) shows in --help."""
    flag = decl.split("/")[0]
    kwargs.setdefault("envvar", "RALLYPOINT_" + flag.lstrip("-").replace("-", "_").upper())
    decls = (decl, dest) if dest else (decl,)
    return click.option(*decls, cls=_Option, show_envvar=True, help=help, **kwargs)


def _apply(*decorators: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """Several decorators as one, applied so --help lists them in the order given."""

    def decorate(func: _F) -> _F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


_logging_options = _apply(
    _opt("--log-format", "Log format on stderr.", type=_Choice(("text", "json")), default="text"),
    _opt("--verbose", "Debug logs, and a traceback with errors.", is_flag=True, default=False),
)
_local_options = _apply(
    _opt(
        "--local-host",
        "Local API addresses (repeat or comma-separate).",
        show_default="127.0.0.1,::1",
        dest="local_hosts",
        envvar="RALLYPOINT_LOCAL_HOSTS",
        multiple=True,
        type=_Words("HOST"),
    ),
    _opt("--local-port", "Local API port.", type=_PORT, default=_S.local_port),
)
_client_options = _apply(
    _local_options,
    _opt(
        "--url",
        "Base URL of the local API.",
        show_default="http://127.0.0.1:<local-port>",
        metavar="URL",
    ),
    _logging_options,
)
_format_option = _opt(
    "--format", "Output format.", dest="fmt", type=_Choice(FORMATS), default="json"
)
_wait_timeout = _opt(
    "--timeout",
    "Give up after S seconds (exit 3); 0 waits forever.",
    envvar="RALLYPOINT_WAIT_TIMEOUT",
    type=_Seconds(allow_zero=True),
    default=300.0,
)
_mdns_interfaces = _opt(
    "--mdns-interface",
    "mDNS interfaces (repeat or comma-separate).",
    show_default="all",
    dest="mdns_interfaces",
    envvar="RALLYPOINT_MDNS_INTERFACES",
    multiple=True,
    type=_Words("IFACE"),
)
_settings_options = _apply(
    _opt("--provider", "Cluster provider.", type=_Provider(), show_default="detect"),
    _local_options,
    _opt("--peer-host", "Peer API address.", default=_S.peer_host, metavar="HOST"),
    _opt("--peer-port", "Peer API port.", type=_PORT, default=_S.peer_port),
    _opt(
        "--master-port",
        "Preferred master port (a user-set MASTER_PORT still wins).",
        show_default="BACKENDAI_DIST_MASTER_PORT, else 29500",
        type=_PORT,
    ),
    _opt(
        "--port-range",
        "Where to look when a preferred port is taken.",
        type=_PortRange(),
        default="{}-{}".format(*_S.port_range),
    ),
    _opt("--tf-port", "Preferred TF worker port.", type=_PORT, default=_S.tf_port),
    _opt(
        "--jax-port",
        "Preferred JAX coordinator port (master; with jax in --frameworks).",
        type=_PORT,
        default=_S.jax_port,
    ),
    _opt("--deadline", "Seconds for the whole rendezvous.", type=_Seconds(), default=_S.deadline_s),
    _opt(
        "--backoff-initial",
        "First retry delay, seconds.",
        type=_Seconds(),
        default=_S.backoff_initial_s,
    ),
    _opt(
        "--backoff-max", "Longest retry delay, seconds.", type=_Seconds(), default=_S.backoff_max_s
    ),
    _opt(
        "--long-poll",
        "Seconds a cluster long-poll stays open.",
        type=_Seconds(),
        default=_S.long_poll_s,
    ),
    _opt(
        "--resolve-timeout",
        "Seconds for one name lookup.",
        type=_Seconds(),
        default=_S.resolve_timeout_s,
    ),
    _opt(
        "--resolve-scope",
        "Peer names to verify (auto: all up to 64 nodes, else a sample).",
        type=_Choice(("auto", "all", "master")),
        default=_S.resolve_scope,
    ),
    _opt(
        "--strict-self/--no-strict-self",
        "Own name on loopback is fatal even when GLOO_SOCKET_IFNAME is served.",
        default=_S.strict_self,
    ),
    _opt(
        "--allow-loopback/--no-allow-loopback",
        "Accept peer names on loopback (one host).",
        default=_S.allow_loopback,
    ),
    _opt(
        "--master-addr",
        "Serve MASTER_ADDR as the master's name or its verified address.",
        dest="master_addr_mode",
        type=_Choice(("name", "ip")),
        default=_S.master_addr_mode,
    ),
    _opt(
        "--emit-ifname/--no-emit-ifname",
        "Serve NCCL_SOCKET_IFNAME besides GLOO_SOCKET_IFNAME / serve neither.",
        default=_S.emit_ifname,
        show_default="GLOO_SOCKET_IFNAME only",
    ),
    _opt(
        "--probe/--no-probe",
        "Try every connection the job will make before turning ready.",
        default=_S.probe,
    ),
    _opt(
        "--probe-timeout",
        "Seconds for one connection probe.",
        type=_Seconds(),
        default=_S.probe_timeout_s,
    ),
    _opt(
        "--frameworks",
        "Frameworks whose variables are served.",
        type=_Words("torch,tf,jax", ("torch", "tf", "jax")),
        default="torch,tf",
    ),
    _opt(
        "--nproc-per-node",
        "Processes per node (WORLD_SIZE = NNODES x N).",
        type=_Int("N", 1, 1 << 16, "a process count: use an integer >= 1"),
        default=_S.nproc_per_node,
    ),
    _opt("--tf-layout", "TF_CONFIG layout.", type=_TFLayout(), default=_S.tf_layout),
    _opt(
        "--set",
        "Override a served variable (repeat; in the variable, one per line).",
        dest="sets",
        type=_KeyValue(),
        multiple=True,
    ),
    _opt(
        "--token-file",
        "File with the session secret (RALLYPOINT_TOKEN: the secret itself).",
        metavar="FILE",
    ),
    _opt("--mdns/--no-mdns", "Announce and browse over mDNS.", default=_S.mdns),
    _mdns_interfaces,
    _logging_options,
)


# --- settings and environment -----------------------------------------------------------


def process_environ() -> dict[str, str]:
    """The mapping providers read: os.environ, plus HOSTNAME when the shell did not export it."""
    environ = dict(os.environ)
    if not environ.get("HOSTNAME"):
        environ["HOSTNAME"] = socket.gethostname()
    return environ


def _flatten(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def _read_token(ctx: click.Context, environ: Mapping[str, str]) -> str | None:
    """The session secret: --token-file (flag) > RALLYPOINT_TOKEN > RALLYPOINT_TOKEN_FILE."""
    path = ctx.params.get("token_file")
    source = ctx.get_parameter_source("token_file")
    direct = environ.get("RALLYPOINT_TOKEN") or None
    if path and direct and source is ParameterSource.ENVIRONMENT:
        raise ConfigError("both RALLYPOINT_TOKEN and RALLYPOINT_TOKEN_FILE are set: keep one")
    if not path:
        return direct
    where = _where(ctx, "token_file", "--token-file", "RALLYPOINT_TOKEN_FILE")
    try:
        token = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(
            f"{where} {path!r} cannot be read ({reason}): check the path and its permissions"
        ) from exc
    if not token:
        raise ConfigError(f"{where} {path!r} is empty: put the session secret in it")
    return token


def build_settings(ctx: click.Context, environ: Mapping[str, str]) -> Settings:
    """The frozen Settings from a command's options (flag > RALLYPOINT_* > default)."""
    p = ctx.params
    s = _DEFAULTS
    settings = Settings(
        provider=p.get("provider") or None,
        local_hosts=_flatten(p.get("local_hosts") or ()) or s.local_hosts,
        local_port=p.get("local_port", s.local_port),
        peer_host=(p.get("peer_host") or s.peer_host).strip(),
        peer_port=p.get("peer_port", s.peer_port),
        master_port=p.get("master_port"),
        port_range=p.get("port_range", s.port_range),
        tf_port=p.get("tf_port", s.tf_port),
        jax_port=p.get("jax_port", s.jax_port),
        deadline_s=p.get("deadline", s.deadline_s),
        backoff_initial_s=p.get("backoff_initial", s.backoff_initial_s),
        backoff_max_s=p.get("backoff_max", s.backoff_max_s),
        long_poll_s=p.get("long_poll", s.long_poll_s),
        resolve_timeout_s=p.get("resolve_timeout", s.resolve_timeout_s),
        resolve_scope=p.get("resolve_scope", s.resolve_scope),
        strict_self=p.get("strict_self", s.strict_self),
        allow_loopback=p.get("allow_loopback", s.allow_loopback),
        master_addr_mode=p.get("master_addr_mode", s.master_addr_mode),
        emit_ifname=p.get("emit_ifname", s.emit_ifname),
        probe=p.get("probe", s.probe),
        probe_timeout_s=p.get("probe_timeout", s.probe_timeout_s),
        frameworks=frozenset(p.get("frameworks", s.frameworks)),
        nproc_per_node=p.get("nproc_per_node", s.nproc_per_node),
        tf_layout=p.get("tf_layout", s.tf_layout),
        sets=tuple(p.get("sets") or ()),
        token=_read_token(ctx, environ) if "token_file" in p else None,
        mdns=p.get("mdns", s.mdns),
        mdns_interfaces=_flatten(p.get("mdns_interfaces") or ()),
        log_format=p.get("log_format", s.log_format),
        verbose=p.get("verbose", s.verbose),
    )
    if settings.backoff_initial_s > settings.backoff_max_s:
        low = _where(ctx, "backoff_initial", "--backoff-initial", "RALLYPOINT_BACKOFF_INITIAL")
        high = _where(ctx, "backoff_max", "--backoff-max", "RALLYPOINT_BACKOFF_MAX")
        raise ConfigError(
            f"{low} {settings.backoff_initial_s:g} is above {high} "
            f"{settings.backoff_max_s:g}: make the first delay the smaller one"
        )
    if "peer_port" in p and settings.local_port == settings.peer_port:
        raise ConfigError(
            f"--local-port and --peer-port are both {settings.local_port}: "
            "give them different ports"
        )
    return settings


def _base_url(ctx: click.Context, settings: Settings) -> str:
    url = ctx.params.get("url")
    if url:
        if not re.match(r"https?://[^/\s]+", url):
            where = _where(ctx, "url", "--url", "RALLYPOINT_URL")
            raise ConfigError(f"{where} {url!r} is not an http URL: use e.g. http://127.0.0.1:7780")
        return str(url).rstrip("/")
    from rallypoint import client

    return client.local_url(settings.local_hosts[0], settings.local_port)


# --- logging: stderr only, text or JSON, the token never printed ---------------------------

_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS and k[:1] != "_"}


def _without_traceback(record: logging.LogRecord) -> logging.LogRecord:
    """A copy of record whose exception is one `(Type: message)` suffix, not a traceback."""
    if not record.exc_info or record.exc_info[1] is None:
        return record
    exc = record.exc_info[1]
    message = f"{record.getMessage()} ({type(exc).__name__}: {_one_line(str(exc))})"
    return logging.makeLogRecord(
        {**vars(record), "msg": message, "args": None, "exc_info": None, "exc_text": None}
    )


class _TextFormatter(logging.Formatter):
    """`time level logger: event key=value ...`; tracebacks only when verbose; secret redacted."""

    def __init__(self, secret: str | None, verbose: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.secret = secret
        self.verbose = verbose

    def format(self, record: logging.LogRecord) -> str:
        record = record if self.verbose else _without_traceback(record)
        text = super().format(record)
        fields = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        text = f"{text} {fields}" if fields else text
        return text.replace(self.secret, "[redacted]") if self.secret else text


class _JsonFormatter(_TextFormatter):
    """One JSON object per line: ts, level, logger, event and the record's extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        record = record if self.verbose else _without_traceback(record)
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
            **_extras(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        text = json.dumps(doc, default=str)
        return text.replace(self.secret, "[redacted]") if self.secret else text


class _Handler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Marks the handler cli.py installed, so a second invocation replaces it."""


def configure_logging(log_format: str, verbose: bool, secret: str | None = None) -> None:
    """Send logs to stderr: rallypoint at INFO (DEBUG with --verbose), libraries at WARNING."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(handler)
    handler = _Handler(sys.stderr)
    formatter = _JsonFormatter if log_format == "json" else _TextFormatter
    handler.setFormatter(formatter(secret, verbose))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    logging.getLogger("rallypoint").setLevel(logging.DEBUG if verbose else logging.INFO)


def _setup(ctx: click.Context) -> tuple[Settings, dict[str, str]]:
    """Logging, environment and Settings for a command, in that order."""
    configure_logging(ctx.params.get("log_format", "text"), ctx.params.get("verbose", False))
    environ = process_environ()
    settings = build_settings(ctx, environ)
    if settings.token:
        configure_logging(settings.log_format, settings.verbose, settings.token)
    return settings, environ


# --- errors and exit codes ----------------------------------------------------------------


def exit_code(exc: BaseException) -> int:
    """The exit code an exception ends the process with."""
    if isinstance(exc, ConfigError):
        return EXIT_USAGE
    if isinstance(exc, RendezvousTimeout):
        return EXIT_TIMEOUT
    return EXIT_FAILED


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "no detail"


class _Command(click.Command):
    """Maps exceptions raised by a command to `error: ...` and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            if ctx.params.get("verbose"):
                traceback.print_exc(file=sys.stderr)
            if isinstance(exc, RallypointError):
                message = str(exc)
            else:
                message = (
                    f"unexpected {type(exc).__name__}: {exc} "
                    "(rerun with --verbose for the traceback)"
                )
            click.echo(f"error: {_one_line(message)}", err=True)
            raise click.exceptions.Exit(exit_code(exc)) from exc


# Raised by click >= 8.2 when the group runs without a command; older clicks print the help.
_NoArgsIsHelp: type[click.UsageError] | tuple[()] = getattr(
    click.exceptions, "NoArgsIsHelpError", ()
)


class _Group(click.Group):
    """Prints click's usage errors as one `error: ...` line; exits with the command's code."""

    command_class = _Command

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
                text = f"{exc.format_message()} (see `{_command_path(exc)} --help`)"
            else:
                text = f"{hint}: {exc.message}"
            code = _fail(text, exc.exit_code)
        except click.UsageError as exc:
            text = f"{exc.format_message()} (see `{_command_path(exc)} --help`)"
            code = _fail(text, exc.exit_code)
        except click.ClickException as exc:
            code = _fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            code = _fail("interrupted", 130)
        if standalone_mode:
            sys.exit(code)
        return code


def _command_path(exc: click.UsageError) -> str:
    return exc.ctx.command_path if exc.ctx else "rallypoint"


def _fail(message: str, code: int) -> int:
    click.echo(f"error: {_one_line(message)}", err=True)
    return code


# --- output helpers ----------------------------------------------------------------------


def write_atomic(path: str | os.PathLike[str], text: str, mode: int = 0o644) -> None:
    """Replace path with text so that a reader sees the old file or the new, never half."""
    try:
        write_atomic_all([(path, text)], mode)
    except Unwritable as exc:
        raise exc.error from None


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


def _emit(text: str) -> None:
    click.echo(text, nl=not text.endswith("\n"))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list | tuple):
        return ",".join(_cell(item) for item in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={_cell(v)}" for k, v in value.items()) or "-"
    return str(value)


# --- commands ----------------------------------------------------------------------------


@click.group(
    cls=_Group,
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


@app.command()
@_settings_options
@click.pass_context
def serve(ctx: click.Context, /, **_: Any) -> None:
    """Run the sidecar until SIGTERM or SIGINT."""
    settings, environ = _setup(ctx)
    import asyncio

    from rallypoint import sidecar

    asyncio.run(sidecar.run(settings, environ))


@app.command()
@_wait_timeout
@_opt(
    "--out",
    "Write the env to FILE atomically (mode 0644), not stdout.",
    envvar="RALLYPOINT_WAIT_OUT",
    metavar="FILE",
)
@_opt(
    "--hostfile",
    "Also write the hostfile (host slots=N per node, rank order) to FILE atomically.",
    envvar="RALLYPOINT_WAIT_HOSTFILE",
    metavar="FILE",
)
@_format_option
@_client_options
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
    settings, _environ = _setup(ctx)
    targets = {
        name: (path, _where(ctx, name, f"--{name}", envvar))
        for name, path, envvar in (
            ("out", out, "RALLYPOINT_WAIT_OUT"),
            ("hostfile", hostfile, "RALLYPOINT_WAIT_HOSTFILE"),
        )
        if path is not None
    }
    # Refuse an unwritable path before waiting minutes for the rendezvous.
    for path, where in targets.values():
        _check_writable(path, where)
    body = _wait(ctx, settings, fmt, timeout)
    files: list[tuple[str, str, str]] = []
    if hostfile is not None:
        from rallypoint import client

        text = client.fetch_hostfile(_base_url(ctx, settings), wait_s=min(timeout or 30.0, 30.0))
        files.append((hostfile, text, targets["hostfile"][1]))
    if out is None:
        _emit(body)
    else:
        files.append((out, body if body.endswith("\n") else body + "\n", targets["out"][1]))
    try:
        write_atomic_all([(path, text) for path, text, _where_ in files])
    except Unwritable as exc:
        where = next(w for path, _text, w in files if path == exc.path)
        raise ConfigError(
            f"{where} {exc.path!r} cannot be written ({exc.reason}): "
            "check that its directory exists and is writable; nothing was written"
        ) from exc
    for path, _text, where in files:
        log.info("file.written", extra={"path": path, "option": where})


def _check_writable(path: str, where: str) -> None:
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


def _wait(ctx: click.Context, settings: Settings, fmt: str, timeout: float) -> str:
    from rallypoint import client

    return client.wait_env(
        _base_url(ctx, settings),
        fmt,
        timeout or None,
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=min(settings.backoff_max_s, 1.0),
    )


@app.command()
@_format_option
@_client_options
@click.pass_context
def env(ctx: click.Context, /, fmt: str, **_: Any) -> None:
    """Print the env now; exit 1 with the reasons when the sidecar is not ready."""
    settings, _environ = _setup(ctx)
    from rallypoint import client

    _emit(client.fetch_env(_base_url(ctx, settings), fmt))


@app.command()
@_opt(
    "--timeout",
    "Seconds to wait for the answer.",
    envvar="RALLYPOINT_CHECK_TIMEOUT",
    type=_Seconds(),
    default=2.0,
)
@_client_options
@click.pass_context
def check(ctx: click.Context, /, timeout: float, **_: Any) -> None:
    """Exit 0 when the local sidecar is ready, 1 otherwise (a HEALTHCHECK without curl)."""
    settings, _environ = _setup(ctx)
    from rallypoint import client

    client.readyz(_base_url(ctx, settings), timeout_s=timeout)


@app.command(
    "exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False}
)
@_wait_timeout
@_client_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_(ctx: click.Context, /, timeout: float, command: tuple[str, ...], **_: Any) -> None:
    """Wait until ready, then run COMMAND with the env merged into its environment."""
    settings, _environ = _setup(ctx)
    body = _wait(ctx, settings, "json", timeout)
    try:
        values = json.loads(body)
    except ValueError as exc:
        raise SidecarError(f"GET /env answered JSON that does not parse: {exc}") from exc
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise SidecarError("GET /env answered JSON that is not an object of strings")
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
        click.echo(f"error: cannot run {command[0]!r}: {exc.strerror or exc}", err=True)
        raise click.exceptions.Exit(126) from None


@app.command()
@_format_option
@_settings_options
@click.pass_context
def derive(ctx: click.Context, /, fmt: str, **_: Any) -> None:
    """Offline: print what this environment would produce, without any network."""
    settings, environ = _setup(ctx)
    from rallypoint import derive as derivation
    from rallypoint import providers, render

    spec = providers.detect(environ, settings.provider)
    result = derivation.derive(spec, None, derive_options(settings, environ))
    try:
        _emit(render.render(result.as_dict(), fmt))
    except ValueError as exc:
        raise ConfigError(f"--format {fmt}: {exc}") from exc
    for override in result.overrides:
        click.echo(
            f"note: {override.key} comes from {override.source}"
            f" (derived: {override.derived or '-'})",
            err=True,
        )
    for warning in result.warnings:
        click.echo(f"warning: {_one_line(warning)}", err=True)
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


def derive_options(settings: Settings, environ: Mapping[str, str]) -> DeriveOptions:
    """DeriveOptions for offline derivation: the preferred ports stand in for reserved ones."""
    from rallypoint import derive as derivation

    return DeriveOptions(
        nproc_per_node=settings.nproc_per_node,
        frameworks=settings.frameworks,
        tf_layout=settings.tf_layout,
        user=derivation.user_values(environ, settings.sets),
        master_port=settings.master_port,  # None: the provider's preferred port, else 29500
        tf_port=settings.tf_port,
        jax_port=settings.jax_port,
    )


@app.command()
@_opt(
    "--json",
    "Print the raw /status document.",
    dest="as_json",
    envvar="RALLYPOINT_STATUS_JSON",
    is_flag=True,
    default=False,
)
@_client_options
@click.pass_context
def status(ctx: click.Context, /, as_json: bool, **_: Any) -> None:
    """The cluster as this sidecar sees it; exit 1 when not ready."""
    settings, _environ = _setup(ctx)
    from rallypoint import client

    doc = client.status(_base_url(ctx, settings))
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
    out = [f"{key.ljust(width)}  {_cell(value)}" for key, value in head]
    peers = [peer for peer in doc.get("peers") or () if isinstance(peer, dict)]
    if peers:
        columns = [c for c in _PEER_COLUMNS if any(peer.get(c) is not None for peer in peers)]
        rows = [[_cell(peer.get(c)) for c in columns] for peer in peers]
        out += ["", _table([c.upper() for c in columns], rows)]
    sections = {
        "reasons": [_reason(r) for r in doc.get("reasons") or ()],
        "warnings": [_cell(w) for w in doc.get("warnings") or ()],
        "overrides": [_override(o) for o in doc.get("overrides") or ()],
    }
    for title, items in sections.items():
        if items:
            out += ["", f"{title}:"] + [f"  - {item}" for item in items]
    return "\n".join(out)


def _reason(reason: object) -> str:
    if isinstance(reason, dict) and "message" in reason:
        return f"{reason.get('code', '?')}: {reason['message']}"
    return _cell(reason)


def _override(item: object) -> str:
    if isinstance(item, dict) and "key" in item:
        derived = item.get("derived")
        return (
            f"{item['key']}={item.get('value')} from {item.get('source')}"
            f" (derived: {'-' if derived is None else derived})"
        )
    return _cell(item)


@app.command()
@_opt(
    "--seconds",
    "How long to listen.",
    envvar="RALLYPOINT_PEERS_SECONDS",
    type=_Seconds(),
    default=3.0,
)
@_mdns_interfaces
@_opt(
    "--json",
    "Print JSON instead of a table.",
    dest="as_json",
    envvar="RALLYPOINT_PEERS_JSON",
    is_flag=True,
    default=False,
)
@_logging_options
@click.pass_context
def peers(ctx: click.Context, /, seconds: float, as_json: bool, **_: Any) -> None:
    """List the rallypoint sidecars announcing themselves over mDNS, any session."""
    settings, _environ = _setup(ctx)
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
            _table([c.upper() for c in columns], [[_cell(d[c]) for c in columns] for d in docs])
        )
    else:
        click.echo(f"no rallypoint announcement seen in {seconds:g}s", err=True)


@app.command()
@_opt(
    "--nodes",
    "How many sidecars to run on this machine.",
    envvar="RALLYPOINT_DEMO_NODES",
    type=_Int("N", 1, 64, "a node count: use an integer 1-64"),
    default=3,
)
@_settings_options
@click.pass_context
def demo(ctx: click.Context, /, nodes: int, **_: Any) -> None:
    """Run N sidecars on loopback and print each node's env and time to ready."""
    settings, _environ = _setup(ctx)
    import asyncio
    import dataclasses
    import secrets

    from rallypoint import demo as demonstration

    if settings.token is None:
        # Sign the demo's peer traffic with a throwaway secret: it shows the real setup.
        settings = dataclasses.replace(settings, token=secrets.token_urlsafe(24))
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


def main() -> None:
    """Console-script entry point of `rallypoint`."""
    app.main(prog_name="rallypoint")
