"""The supervised child's process: killed with `run`, and its orphans reaped as PID 1."""

from __future__ import annotations

import os
import signal


def die_with_parent() -> None:
    """In the child: SIGKILL it when `run` dies (a SIGKILL `run` cannot pass on, say).

    Linux's PR_SET_PDEATHSIG; elsewhere, or when it fails, nothing: the job then outlives a
    killed `run`, as it would any other parent.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def reap_orphans() -> None:
    """As PID 1 (a container's entrypoint) the job's orphans are ours to reap."""
    if os.getpid() != 1:
        return
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass
