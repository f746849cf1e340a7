"""A command's start: logging, the process environment, and Settings from its options."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import click
from click.core import ParameterSource

from rallypoint import settings
from rallypoint.cli.options import where
from rallypoint.errors import ConfigError
from rallypoint.logs import configure_logging
from rallypoint.settings import Settings

#: Option names whose Settings field counts seconds (the field carries an `_s`).
_SECONDS = frozenset(
    {"deadline", "backoff_initial", "backoff_max", "long_poll", "resolve_timeout", "probe_timeout"}
)
#: Options that are not Settings fields, or need more than a rename.
_NOT_FIELDS = frozenset(
    {"token_file", "url", "fmt", "timeout", "out", "hostfile", "as_json", "seconds", "nodes"}
    | {"command", "local_hosts", "mdns_interfaces"}
)


def process_environ() -> dict[str, str]:
    """The mapping providers read: os.environ, plus HOSTNAME when the shell did not export it."""
    environ = dict(os.environ)
    if not environ.get("HOSTNAME"):
        environ["HOSTNAME"] = socket.gethostname()
    return environ


def _field(option: str) -> str:
    return option + "_s" if option in _SECONDS else option


def _flatten(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(item for group in groups for item in group)


def _read_token(ctx: click.Context, environ: Mapping[str, str]) -> str | None:
    """The session secret: --token-file (flag) > RALLYPOINT_TOKEN > RALLYPOINT_TOKEN_FILE."""
    # Imported here: `check` and the other client commands take no token, and auth pulls in
    # hashlib, hmac and secrets (random), which a HEALTHCHECK run every few seconds skips.
    from rallypoint import auth

    return auth.load_token(
        ctx.params.get("token_file"),
        environ.get("RALLYPOINT_TOKEN") or None,
        where=where(ctx, "token_file", "--token-file", "RALLYPOINT_TOKEN_FILE"),
        both_from_env=ctx.get_parameter_source("token_file") is ParameterSource.ENVIRONMENT,
    )


def build_settings(ctx: click.Context, environ: Mapping[str, str]) -> Settings:
    """The frozen Settings from a command's options (flag > RALLYPOINT_* > default)."""
    p = ctx.params
    values: dict[str, Any] = {
        _field(name): value
        for name, value in p.items()
        if name not in _NOT_FIELDS and value is not None
    }
    values["local_hosts"] = _flatten(p.get("local_hosts") or ())
    values["mdns_interfaces"] = _flatten(p.get("mdns_interfaces") or ())
    if "token_file" in p:
        values["token"] = _read_token(ctx, environ)
    labels = {
        _field(option.name): option.envvar
        for option in ctx.command.params
        if option.name is not None
        and isinstance(option.envvar, str)
        and ctx.get_parameter_source(option.name) is ParameterSource.ENVIRONMENT
    }
    return settings.from_mapping(values, labels)


def setup(ctx: click.Context) -> tuple[Settings, dict[str, str]]:
    """Logging, environment and Settings for a command, in that order."""
    configure_logging(ctx.params.get("log_format", "text"), ctx.params.get("verbose", False))
    environ = process_environ()
    built = build_settings(ctx, environ)
    if built.token:
        configure_logging(built.log_format, built.verbose, built.token)
    return built, environ


def base_url(ctx: click.Context, settings: Settings) -> str:
    """The local API's URL: --url, else the first local address and the local port."""
    url = ctx.params.get("url")
    if url:
        if not re.match(r"https?://[^/\s]+", url):
            at = where(ctx, "url", "--url", "RALLYPOINT_URL")
            raise ConfigError(f"{at} {url!r} is not an http URL: use e.g. http://127.0.0.1:7780")
        return str(url).rstrip("/")
    from rallypoint import client

    return client.local_url(settings.local_hosts[0], settings.local_port)
