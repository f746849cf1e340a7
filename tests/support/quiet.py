"""A quiet machine for the tests that measure it, when the suite runs side by side.

A few tests assert that a healthy cluster's data path measures healthy: no slow link, no
retransmits, no warning at all. On two cores shared with three other workers starting real
frameworks, that measurement sees a starved machine and is right to warn (docs/testing.md).
Side by side (pytest-xdist), such a test (marker ``quiet_machine``) holds this lock
exclusively, and every test of a tier that starts processes (``BUSY_TIERS`` in
tests/conftest.py) holds it shared: the measuring test waits until the busy tests of the
moment finish, and none starts beside it. In-process and unit tests run on regardless.

Two ``flock`` files make it fair: an exclusive holder first takes the turnstile, which
every shared taker passes through, so a steady stream of busy tests cannot starve it. One
after another nothing is locked: the controller of a side-by-side run makes the lock's
directory (``start``) and hands it to its workers in ``LOCKS_VARIABLE``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

#: The directory of a side-by-side run's lock files, set for its workers.
LOCKS_VARIABLE = "RALLYPOINT_TEST_LOCKS"


def start() -> None:
    """Make this run's lock directory; the workers started after this inherit it."""
    os.environ[LOCKS_VARIABLE] = tempfile.mkdtemp(prefix="rallypoint-tests-")


def finish() -> None:
    """Remove this run's lock directory."""
    locks = os.environ.pop(LOCKS_VARIABLE, None)
    if locks is not None:
        shutil.rmtree(locks, ignore_errors=True)


@contextmanager
def _flocked(path: Path, operation: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, operation)
        yield
    finally:
        os.close(fd)  # closing the last descriptor releases the lock


@contextmanager
def hold(exclusive: bool) -> Iterator[None]:
    """Hold the run's lock, exclusively (a measuring test) or shared (a busy one)."""
    locks = os.environ.get(LOCKS_VARIABLE)
    if locks is None:  # one after another: nothing runs beside the test
        yield
        return
    turnstile, lock = Path(locks, "turnstile"), Path(locks, "lock")
    with ExitStack() as held:
        with _flocked(turnstile, fcntl.LOCK_EX):
            held.enter_context(_flocked(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH))
        yield
