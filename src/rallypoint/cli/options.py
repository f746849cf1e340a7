"""Option types and option bundles: every bad value fails naming its flag or variable."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from rallypoint import fanout, settings
from rallypoint.errors import ConfigError
from rallypoint.model import DEFAULT_MASTER_PORT
from rallypoint.settings import Settings

FORMATS = ("json", "sh", "dotenv")  # render.FORMATS, repeated so --help needs no import
_F = TypeVar("_F", bound=Callable[..., Any])

if TYPE_CHECKING:
    _ParamType = click.ParamType[Any]  # generic in the click the type checker sees
else:
    _ParamType = click.ParamType


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


def where(ctx: click.Context, name: str, flag: str, envvar: str) -> str:
    """The flag or variable a parameter's value came from, for messages."""
    source = ctx.get_parameter_source(name)
    return envvar if source is ParameterSource.ENVIRONMENT else flag


_UINT = re.compile(r"[0-9]+")


class Int(_ParamType):
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


class Seconds(_ParamType):
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


class Choice(_ParamType):
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
    """A TF_CONFIG layout, as settings.tf_layout reads it."""

    name = "workers|chief|evaluator|ps:N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return settings.tf_layout(str(value))
        except ConfigError as exc:
            self.fail(str(exc), param, ctx)


class _RelayGroup(_ParamType):
    """auto, 0 (no fan-out tree) or a group size of 2-128 ranks."""

    name = "auto|0|2-128"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> int | None:
        if value is None or isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text == "auto":
            return None
        if not _UINT.fullmatch(text) or int(text) == 1 or int(text) > fanout.MAX_GROUP:
            self.fail(
                f"{value!r} is not a relay group size: use auto, 0 (every worker joins the "
                f"master) or 2-{fanout.MAX_GROUP}",
                param,
                ctx,
            )
        return int(text)


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


_PORT = Int("port", 1, 65535, "a port number: use an integer 1-65535")
_S = Settings()


def opt(decl: str, help: str, *, dest: str | None = None, **kwargs: Any) -> Callable[[_F], _F]:
    """An option whose RALLYPOINT_* variable (from its flag unless given) shows in --help."""
    flag = decl.split("/")[0]
    kwargs.setdefault("envvar", "RALLYPOINT_" + flag.lstrip("-").replace("-", "_").upper())
    decls = (decl, dest) if dest else (decl,)
    return click.option(*decls, cls=_Option, show_envvar=True, help=help, **kwargs)


def apply(*decorators: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """Several decorators as one, applied so --help lists them in the order given."""

    def decorate(func: _F) -> _F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


logging_options = apply(
    opt("--log-format", "Log format on stderr.", type=Choice(("text", "json")), default="text"),
    opt("--verbose", "Debug logs, and a traceback with errors.", is_flag=True, default=False),
)
local_options = apply(
    opt(
        "--local-host",
        "Local API addresses (repeat or comma-separate).",
        show_default="127.0.0.1,::1",
        dest="local_hosts",
        envvar="RALLYPOINT_LOCAL_HOSTS",
        multiple=True,
        type=_Words("HOST"),
    ),
    opt("--local-port", "Local API port.", type=_PORT, default=_S.local_port),
)
client_options = apply(
    local_options,
    opt(
        "--url",
        "Base URL of the local API.",
        show_default="http://127.0.0.1:<local-port>",
        metavar="URL",
    ),
    logging_options,
)
format_option = opt("--format", "Output format.", dest="fmt", type=Choice(FORMATS), default="json")
wait_timeout = opt(
    "--timeout",
    "Give up after S seconds (exit 3); 0 waits forever.",
    envvar="RALLYPOINT_WAIT_TIMEOUT",
    type=Seconds(allow_zero=True),
    default=300.0,
)
mdns_interfaces = opt(
    "--mdns-interface",
    "mDNS interfaces (repeat or comma-separate).",
    show_default="all",
    dest="mdns_interfaces",
    envvar="RALLYPOINT_MDNS_INTERFACES",
    multiple=True,
    type=_Words("IFACE"),
)
settings_options = apply(
    opt("--provider", "Cluster provider.", type=_Provider(), show_default="detect"),
    local_options,
    opt("--peer-host", "Peer API address.", default=_S.peer_host, metavar="HOST"),
    opt("--peer-port", "Peer API port.", type=_PORT, default=_S.peer_port),
    opt(
        "--master-port",
        "Preferred master port (a user-set MASTER_PORT still wins).",  # model.master_ports
        show_default=f"BACKENDAI_DIST_MASTER_PORT, else {DEFAULT_MASTER_PORT}",
        type=_PORT,
    ),
    opt(
        "--port-range",
        "Where to look when a preferred port is taken.",
        type=_PortRange(),
        default="{}-{}".format(*_S.port_range),
    ),
    opt("--tf-port", "Preferred TF worker port.", type=_PORT, default=_S.tf_port),
    opt(
        "--jax-port",
        "Preferred JAX coordinator port (master; with jax in --frameworks).",
        type=_PORT,
        default=_S.jax_port,
    ),
    opt("--deadline", "Seconds for the whole rendezvous.", type=Seconds(), default=_S.deadline_s),
    opt(
        "--backoff-initial",
        "First retry delay, seconds.",
        type=Seconds(),
        default=_S.backoff_initial_s,
    ),
    opt("--backoff-max", "Longest retry delay, seconds.", type=Seconds(), default=_S.backoff_max_s),
    opt(
        "--long-poll",
        "Seconds a cluster long-poll stays open.",
        type=Seconds(),
        default=_S.long_poll_s,
    ),
    opt(
        "--resolve-timeout",
        "Seconds for one name lookup.",
        type=Seconds(),
        default=_S.resolve_timeout_s,
    ),
    opt(
        "--resolve-scope",
        "Peer names to verify (auto: all up to 64 nodes, else a sample).",
        type=Choice(("auto", "all", "master")),
        default=_S.resolve_scope,
    ),
    opt(
        "--strict-self/--no-strict-self",
        "Own name on loopback is fatal even when GLOO_SOCKET_IFNAME is served.",
        default=_S.strict_self,
    ),
    opt(
        "--allow-loopback/--no-allow-loopback",
        "Accept peer names on loopback (one host).",
        default=_S.allow_loopback,
    ),
    opt(
        "--master-addr",
        "Serve MASTER_ADDR as the master's name or its verified address.",
        dest="master_addr_mode",
        type=Choice(("name", "ip")),
        default=_S.master_addr_mode,
    ),
    opt(
        "--emit-ifname/--no-emit-ifname",
        "Serve NCCL_SOCKET_IFNAME besides GLOO_SOCKET_IFNAME / serve neither.",
        default=_S.emit_ifname,
        show_default="GLOO_SOCKET_IFNAME only",
    ),
    opt(
        "--probe/--no-probe",
        "Try every connection the job will make before turning ready.",
        default=_S.probe,
    ),
    opt(
        "--probe-timeout",
        "Seconds for one connection probe.",
        type=Seconds(),
        default=_S.probe_timeout_s,
    ),
    opt(
        "--frameworks",
        "Frameworks whose variables are served.",
        type=_Words("torch,tf,jax", ("torch", "tf", "jax")),
        default="torch,tf",
    ),
    opt(
        "--nproc-per-node",
        "Processes per node (WORLD_SIZE = NNODES x N).",
        type=Int("N", 1, 1 << 16, "a process count: use an integer >= 1"),
        default=_S.nproc_per_node,
    ),
    opt("--tf-layout", "TF_CONFIG layout.", type=_TFLayout(), default=_S.tf_layout),
    opt(
        "--set",
        "Override a served variable (repeat; in the variable, one per line).",
        dest="sets",
        type=_KeyValue(),
        multiple=True,
    ),
    opt(
        "--token-file",
        "File with the session secret (RALLYPOINT_TOKEN: the secret itself).",
        metavar="FILE",
    ),
    opt(
        "--relay-group",
        "Ranks per relay in the fan-out tree (auto: sqrt(N) from 512 nodes; 0: none).",
        dest="relay_group_size",
        type=_RelayGroup(),
        default="auto",
    ),
    opt("--mdns/--no-mdns", "Announce and browse over mDNS.", default=_S.mdns),
    mdns_interfaces,
    logging_options,
)
