"""scripts/busy.py: the command's status passes through, and the machine's busy time is read."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support.commands import python

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "busy.py"
LINE = re.compile(r"busy\.py: (\d+) s wall, (\d+) CPU-seconds busy, (\d+)% of (\d+) cores")


def test_the_commands_status_passes_through_with_the_busy_line() -> None:
    done = python(str(SCRIPT), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert done.returncode == 3
    match = LINE.search(done.stderr)
    assert match is not None, done.stderr
    assert int(match.group(4)) >= 1


def test_no_command_is_a_usage_error() -> None:
    done = python(str(SCRIPT))
    assert done.returncode == 2
    assert "usage: python scripts/busy.py -- COMMAND" in done.stderr
