"""Processes of a namespace cluster: each in its own process group, some under faketime."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support import netns


def base_environ() -> dict[str, str]:
    """The few variables a child needs; nothing of the caller's environment leaks into nodes."""
    env = netns.base_environ(keep=("PYTHONPATH", "VIRTUAL_ENV"))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Proc:
    """A process started inside a node's namespace, in its own process group."""

    name: str
    argv: tuple[str, ...]
    log_path: Path
    popen: subprocess.Popen[bytes]
    #: Started under `faketime_argv`: ``pid`` is the wrapper, the program its child.
    faketime: bool = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _reaped(self, timeout_s: float = 0.0) -> None:
        """After the exit of ``pid``: for a faketime wrapper, wait for its child and clean up.

        The wrapper dies of a signal at once, while the program it runs may still be
        shutting down: wait (up to timeout_s, then SIGKILL) until nothing of the process
        group is left, then remove the wrapper's shared memory, which it only removes on a
        normal exit.
        """
        if not self.faketime or self.popen.poll() is None:
            return
        if not _group_gone(self.popen.pid, timeout_s):
            self.signal(signal.SIGKILL)
            _group_gone(self.popen.pid, 5.0)
        for path in faketime_files(self.popen.pid):
            path.unlink(missing_ok=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def signal(self, signum: int = signal.SIGKILL) -> None:
        """Send signum to the whole process group (no-op once it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def kill(self, *, timeout_s: float = 10.0) -> None:
        """SIGKILL the process group and reap it."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=timeout_s)
        self._reaped(timeout_s)

    def stop(self, *, grace_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after grace_s; return the exit code."""
        self.signal(signal.SIGTERM)
        try:
            code = self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.poll()
        self._reaped(grace_s)
        return code

    def wait(self, timeout_s: float) -> int:
        """Wait for exit; subprocess.TimeoutExpired if it takes longer."""
        code = self.popen.wait(timeout=timeout_s)
        self._reaped(timeout_s)
        return code

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def wait_all(procs: Mapping[str, Proc], timeout_s: float) -> dict[str, int]:
    """Each process's exit status, each given ``timeout_s`` to end; one that does not fails
    the test with every log's tail. Every process is killed (and reaped) either way."""
    try:
        return {name: proc.wait(timeout_s) for name, proc in procs.items()}
    except subprocess.TimeoutExpired:
        pytest.fail(f"a run did not end: {[p.log()[-3000:] for p in procs.values()]}")
    finally:
        for proc in procs.values():
            proc.kill()


def faketime_argv(offset_s: float, argv: Sequence[str]) -> list[str]:
    """argv under Debian's `faketime`, its wall clock ``offset_s`` seconds off (+ ahead).

    ``FAKETIME_DONT_FAKE_MONOTONIC=1``: only CLOCK_REALTIME and friends move; monotonic
    clocks (asyncio's timers, every timeout) are the machine's. ``-m`` is the thread-safe
    libfaketime (the sidecar and torch run threads). Children inherit it (LD_PRELOAD).

    Debian 12's libfaketime 0.9.10 has a bug with that setting (wolfcw/libfaketime#426):
    ``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)`` fails with EINVAL, so Python 3.11's
    ``time.sleep`` raises ``OSError: [Errno 22]``; asyncio, threading waits, select and
    torch's store and gloo timeouts work. Without the setting, ``threading.Event.wait``
    with a timeout hangs and monotonic clocks jump to the epoch, so it stays.
    """
    if shutil.which("faketime") is None:
        raise RuntimeError("`faketime` is not on PATH (apt-get install faketime)")
    # Whole seconds as such; libfaketime reads a fraction's separator from the locale.
    whole = float(offset_s).is_integer()
    offset = f"{int(offset_s):+d}" if whole else f"{offset_s:+.6f}".rstrip("0")
    return ["env", "FAKETIME_DONT_FAKE_MONOTONIC=1", "faketime", "-m", "-f", offset, *argv]


def faketime_files(pid: int) -> tuple[Path, Path]:
    """The POSIX shared memory and semaphore the faketime wrapper of pid creates."""
    return Path(f"/dev/shm/faketime_shm_{pid}"), Path(f"/dev/shm/sem.faketime_sem_{pid}")


def _group_gone(pgid: int, timeout_s: float) -> bool:
    """Wait until no live (non-zombie) process is left in process group pgid."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] != "Z":
                    alive = True
                    break
        if not alive:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def read_json_file(path: Path) -> Any:
    """A JSON file's content, or None while it does not exist yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
