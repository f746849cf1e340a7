"""The command line as a user runs it: through click's runner, or as a child process
(`rallypoint`, from tests.support.commands)."""

from __future__ import annotations

from collections.abc import Mapping

from click.testing import CliRunner, Result

from rallypoint.cli.commands import app
from tests.support.commands import rallypoint as rallypoint
from tests.support.env import clean_env


def run(args: list[str], env: Mapping[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, args, env=clean_env(env), catch_exceptions=False)
