"""The command line as a user runs it: through click's runner, or as a child process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping

from click.testing import CliRunner, Result

from rallypoint.cli.commands import app
from tests.support.env import child_env, clean_env


def run(args: list[str], env: Mapping[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, args, env=clean_env(env), catch_exceptions=False)


def rallypoint(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """The real command line in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "rallypoint", *args],
        env={**child_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip
