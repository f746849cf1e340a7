"""A command's start from its click context: logging, the environment and Settings."""

from __future__ import annotations

import re

import click
from click.core import ParameterSource

from rallypoint.cli import config
from rallypoint.cli.options import where
from rallypoint.errors import ConfigError
from rallypoint.settings import Settings


def from_env(ctx: click.Context) -> dict[str, str]:
    """Each option whose value came from its RALLYPOINT_* variable, with that variable."""
    return {
        option.name: option.envvar
        for option in ctx.command.params
        if option.name is not None
        and isinstance(option.envvar, str)
        and ctx.get_parameter_source(option.name) is ParameterSource.ENVIRONMENT
    }


def setup(ctx: click.Context) -> tuple[Settings, dict[str, str]]:
    """Logging, environment and Settings for a command, in that order."""
    return config.start(ctx.params, from_env(ctx))


def base_url(ctx: click.Context, settings: Settings) -> str:
    """The local API's URL: --url, else the first local address and the local port."""
    url = ctx.params.get("url")
    if url:
        if not re.match(r"https?://[^/\s]+", url):
            at = where(ctx, "url", "--url", "RALLYPOINT_URL")
            raise ConfigError(f"{at} {url!r} is not an http URL: use e.g. http://127.0.0.1:7780")
        return str(url).rstrip("/")
    from rallypoint.cli import client

    return client.local_url(settings.local_hosts[0], settings.local_port)
