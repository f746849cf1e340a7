"""The cause a failed child leaves behind: the file `run` names in its env (docs/run.md).

Each attempt's child gets ``RALLYPOINT_ERROR_FILE`` and, unless the user set it,
``TORCHELASTIC_ERROR_FILE``: the same path, fresh for the attempt. torch writes the root
cause there as JSON for a script decorated with ``@record`` (torchrun copies its failed
worker's file over its own, with the worker's exit code), and any job may write one plain
line of reason. When the child fails, `run` reads it back as one short line that the first
failure carries to every node.

The file is the job's, so it is untrusted: read without following a symlink, only when it
is a regular file written since the attempt began, at most MAX_READ bytes, and cut to one
line of printable text of at most MAX_CAUSE characters. Anything else is "no cause".
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping

from rallypoint.wire.jobstates import MAX_CAUSE

#: The env names the child gets; torch's is left alone when the user set it.
RALLYPOINT_ERROR_FILE = "RALLYPOINT_ERROR_FILE"
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
#: Bytes read at most: torch's JSON holds a whole traceback after the message.
MAX_READ = 64 * 1024
#: A tmpfs on Linux (Docker gives every container one of 64 MiB).
SHM = "/dev/shm"


class ErrorFiles:
    """One run's error files: a fresh path per attempt, in a directory of the run's own."""

    def __init__(self, env: Mapping[str, str]) -> None:
        #: The user's own torch error file, which torch and torchrun keep writing to.
        self.users = env.get(TORCHELASTIC_ERROR_FILE) or None
        self._dir: str | None = None
        self.path: str | None = None
        self._since = 0.0

    def for_attempt(self, attempt: int, now: float) -> dict[str, str]:
        """The env entries for ``attempt``'s child (an attempt's file never holds an older
        attempt's cause)."""
        self._since = now
        if self.users is not None:
            self.path = self.users
            return {RALLYPOINT_ERROR_FILE: self.users}
        self.path = self.file(f"error-attempt-{attempt}.json")
        return {RALLYPOINT_ERROR_FILE: self.path, TORCHELASTIC_ERROR_FILE: self.path}

    def file(self, name: str) -> str:
        """A path in the run's own directory (made on first use; gone with remove())."""
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="rallypoint-run-", dir=scratch_dir())
        return os.path.join(self._dir, name)

    def cause(self) -> str:
        """The cause the attempt's child left, as one line ("" when none)."""
        return "" if self.path is None else read_cause(self.path, self._since)

    def remove(self) -> None:
        """Remove the run's directory (never the user's own file)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def scratch_dir() -> str | None:
    """Where a run keeps its files: /dev/shm when it can (memory: a progress mark each step
    costs no disk work), else the temporary directory (None)."""
    return SHM if os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK) else None


class NotRegular(OSError):
    """A job's file that is there but is not a regular file (a directory, a FIFO)."""


def read_regular(path: str, limit: int) -> tuple[bytes, os.stat_result]:
    """At most ``limit`` bytes of ``path``, a file the job controls, and its stat: opened
    without following a symlink nor blocking on a FIFO. NotRegular for anything but a
    regular file; another OSError when it cannot be opened or read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegular(f"{path} is not a regular file")
        return os.read(fd, limit), info
    finally:
        os.close(fd)


def read_cause(path: str, since: float = 0.0) -> str:
    """One line of cause from ``path``: torch's JSON error file or a plain line of text;
    "" when there is none, it is not a regular file, or it was not written since ``since``."""
    try:
        data, info = read_regular(path, MAX_READ)
    except OSError:
        return ""
    return "" if info.st_mtime < since else parse_cause(data)


def parse_cause(data: bytes) -> str:
    """The cause in an error file's bytes, as one sanitised line (see read_cause)."""
    text = data.decode("utf-8", errors="replace")
    message, code = _torch_message(text)
    if message is None:
        message = next((line for line in text.splitlines() if line.strip()), "")
    line = one_line(message)
    if line and isinstance(code, int) and not isinstance(code, bool) and code != 0:
        # torchrun's copy of its failed worker's file names the worker's own status.
        worker = f"worker signal {-code}" if code < 0 else f"worker exit {code}"
        line = one_line(f"{line} ({worker})")
    return line


def _torch_message(text: str) -> tuple[str | None, object]:
    """torch's {"message": {"message": ..., "errorCode": ...}} (or a string message)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    outer = doc.get("message")
    if isinstance(outer, str):
        return outer, None
    if isinstance(outer, dict) and isinstance(outer.get("message"), str):
        return outer["message"], outer.get("errorCode")
    return None, None


def one_line(text: str) -> str:
    """Printable characters only, whitespace runs as one space, at most MAX_CAUSE."""
    kept = "".join(c if c.isprintable() else " " for c in text)
    line = " ".join(kept.split())
    return line if len(line) <= MAX_CAUSE else line[: MAX_CAUSE - 3].rstrip() + "..."
