"""Child processes run to their end: the one way tests, their harness and benchmarks do it.

Output is captured as text, stdin is closed (or given ``input``), a timeout always applies,
and ``check`` raises `CommandFailed` with what the command said. Importable without pytest
(the namespace cluster and the benchmarks use it). Processes that keep running beside a
test (sidecars, jobs) are started where their logs are kept: `Node.spawn`, the fixtures.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.support.env import child_env


class CommandFailed(RuntimeError):
    """A command run with ``check`` exited with a status other than 0."""


def run(
    argv: Sequence[str],
    *,
    timeout_s: float,
    check: bool,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    cwd: Path | None = None,
    new_session: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Run argv to its end; with ``check``, raise `CommandFailed` when it fails.

    ``env`` None inherits this process's environment; ``new_session`` starts the command
    in a session of its own (no signal of the test's terminal reaches it).
    """
    done = subprocess.run(
        list(argv),
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=None if env is None else dict(env),
        cwd=cwd,
        check=False,
        start_new_session=new_session,
    )
    if check and done.returncode != 0:
        said = "\n".join(
            f"--- {name}\n{text.rstrip()}"
            for name, text in (("stdout", done.stdout), ("stderr", done.stderr))
            if text.strip()
        )
        raise CommandFailed(f"{' '.join(argv)} failed ({done.returncode})\n{said}".rstrip())
    return done


def python(
    *args: str,
    timeout_s: float = 60.0,
    check: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` (``-c CODE``, a script, ``-m MODULE``), run to its end."""
    return run([sys.executable, *args], timeout_s=timeout_s, check=check, env=env, cwd=cwd)


def rallypoint(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """The command line in a child process, without the test process's cluster variables."""
    return python(
        "-m", "rallypoint", *args, env={**child_env(), **(env or {})}, timeout_s=timeout_s
    )


async def start_rallypoint(
    *args: str, env: Mapping[str, str] | None = None
) -> asyncio.subprocess.Process:
    """The command line started in the background (``run``, ``exec``) beside an in-process
    cluster: stdout and stderr piped, read with ``communicate()``."""
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rallypoint", *args,
        env={**child_env(), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
