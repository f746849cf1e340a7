"""The supervised child's process group: signalled as one, waited for, cleared at the end.

The child runs in a new session, so its pid is its group's id: a signal to the group reaches
the whole job, data-loader workers included, and nothing of it is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from rallypoint.cli import childproc

#: Longest wait for what is left of a group after the child ended, before SIGKILL.
CLEAR_MAX_S = 5.0


class ChildGroup:
    """One started child and its process group."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child

    def signal(self, signum: int) -> bool:
        """Send ``signum`` to the group; whether anything of it was left (0 only asks)."""
        try:
            os.killpg(self.child.pid, signum)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # a member changed its credentials: it is still there
        return True

    def wait(self, timeout_s: float | None) -> bool:
        """Wait for the child itself to end; whether it did within ``timeout_s``."""
        try:
            self.child.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, grace_s: float) -> bool:
        """SIGTERM to the group, then SIGKILL if the child is still there after ``grace_s``;
        whether it needed the SIGKILL."""
        self.signal(signal.SIGTERM)
        if self.wait(grace_s):
            return False
        self.signal(signal.SIGKILL)
        self.wait(None)
        return True

    def clear(self, grace_s: float) -> None:
        """What is left of the group once the child ended (a data-loader worker, say):
        SIGTERM, then SIGKILL after ``grace_s`` (at most CLEAR_MAX_S)."""
        if not self.signal(signal.SIGTERM):
            return
        deadline = time.monotonic() + min(grace_s, CLEAR_MAX_S)
        while time.monotonic() < deadline:
            childproc.reap_orphans()
            if not self.signal(0):
                return
            time.sleep(0.05)
        self.signal(signal.SIGKILL)
        childproc.reap_orphans()
