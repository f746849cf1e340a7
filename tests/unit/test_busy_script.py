"""scripts/busy.py: the command's status passes through, and the machine's busy time is read."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "busy.py"
LINE = re.compile(r"busy\.py: (\d+) s wall, (\d+) CPU-seconds busy, (\d+)% of (\d+) cores")


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=60
    )


def test_the_commands_status_passes_through_with_the_busy_line() -> None:
    done = run("--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    match = LINE.search(done.stderr)
    assert match is not None, done.stderr
    assert int(match.group(4)) >= 1


def test_no_command_is_a_usage_error() -> None:
    done = run()
    assert done.returncode == 2
    assert "usage: python scripts/busy.py -- COMMAND" in done.stderr
