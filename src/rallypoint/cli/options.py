"""click options from specs.py and rules.py: every bad value fails naming its flag or variable."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from rallypoint.cli import rules, specs

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


class _Rule(_ParamType):
    """A rule of rules.py as a click type: its refusal becomes click's BadParameter."""

    def __init__(self, rule: rules.Rule) -> None:
        self.rule, self.name = rule, rule.name

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return f"[{self.name}]" if isinstance(self.rule, rules.Choice) else None

    def split_envvar_value(self, rv: str) -> Sequence[str]:
        return self.rule.split(rv)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.rule(value)
        except rules.Invalid as exc:
            self.fail(str(exc), param, ctx)


class _Bool(click.types.BoolParamType):
    """rules.Bool as a boolean flag's type; what it refuses, click refuses in its own words."""

    def __init__(self, rule: rules.Rule) -> None:
        self.rule = rule

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> bool:
        try:
            return bool(self.rule(value))
        except rules.Invalid:
            return super().convert(value, param, ctx)


def option(spec: specs.Spec) -> Callable[[_F], _F]:
    """The click option of a spec, its RALLYPOINT_* variable shown in --help."""
    kwargs: dict[str, Any] = {"envvar": spec.envvar}
    if isinstance(spec.rule, rules.Bool):
        kwargs["type"] = _Bool(spec.rule)
    elif spec.rule is not None:
        kwargs["type"] = _Rule(spec.rule)
    if spec.default is not specs.UNSET:
        kwargs["default"] = spec.default
    for key in ("show_default", "metavar"):
        if getattr(spec, key) is not None:
            kwargs[key] = getattr(spec, key)
    if spec.multiple:
        kwargs["multiple"] = True
    if spec.is_flag and not spec.off_flags:
        kwargs["is_flag"] = True
    decls = (spec.decl, spec.name) if spec.dest_given else (spec.decl,)
    return click.option(*decls, cls=_Option, show_envvar=True, help=spec.help, **kwargs)


def opt(decl: str, help: str, **kwargs: Any) -> Callable[[_F], _F]:
    """An option whose RALLYPOINT_* variable (from its flag unless given) shows in --help."""
    return option(specs.Spec(decl, help, **kwargs))


def seconds_option(decl: str, help: str, envvar: str, default: float) -> Callable[[_F], _F]:
    """An option of seconds (above zero), also read from envvar; --help shows both."""
    return opt(decl, help, envvar=envvar, rule=rules.Seconds(), default=default)


def apply(*decorators: Callable[[_F], _F]) -> Callable[[_F], _F]:
    """Several decorators as one, applied so --help lists them in the order given."""

    def decorate(func: _F) -> _F:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return decorate


logging_options = apply(*map(option, specs.LOGGING))
client_options = apply(
    *map(option, specs.LOCAL),
    opt(
        "--url",
        "Base URL of the local API.",
        show_default="http://127.0.0.1:<local-port>",
        metavar="URL",
    ),
    logging_options,
)
format_option = opt(
    "--format", "Output format.", dest="fmt", rule=rules.Choice(FORMATS), default="json"
)
wait_timeout = opt(
    "--timeout",
    "Give up after S seconds (exit 3); 0 waits forever.",
    envvar="RALLYPOINT_WAIT_TIMEOUT",
    rule=rules.Seconds(allow_zero=True),
    default=300.0,
)
quiet_option = opt(
    "--quiet",
    "No progress on stderr while waiting (errors are still printed).",
    is_flag=True,
    default=False,
)
mdns_interfaces = option(specs.MDNS_INTERFACES)
settings_options = apply(*map(option, specs.SETTINGS))
