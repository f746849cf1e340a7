"""The side-by-side run's quiet-machine lock (tests/support/quiet.py): busy tests share it,
a measuring test holds it alone, and busy tests that arrive while it waits do not starve it."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import quiet

WAIT_S = 10.0


@pytest.fixture
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(quiet.LOCKS_VARIABLE, str(tmp_path))
    yield tmp_path


class Holder(threading.Thread):
    """Holds the lock (exclusive or shared) until told to let go, logging when it got it."""

    def __init__(self, name: str, exclusive: bool, log: list[str]) -> None:
        super().__init__(name=name, daemon=True)
        self.exclusive, self.log = exclusive, log
        self.inside, self.release = threading.Event(), threading.Event()

    def run(self) -> None:
        with quiet.hold(self.exclusive):
            self.log.append(f"{self.name} in")
            self.inside.set()
            self.release.wait(WAIT_S)
            self.log.append(f"{self.name} out")

    def let_go(self) -> None:
        self.release.set()
        self.join(WAIT_S)
        assert not self.is_alive(), self.name


def turnstile_taken(locks: Path) -> bool:
    fd = os.open(locks / "turnstile", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_busy_tests_share_the_lock(locks: Path) -> None:
    log: list[str] = []
    first, second = Holder("a", False, log), Holder("b", False, log)
    first.start()
    assert first.inside.wait(WAIT_S)
    second.start()
    assert second.inside.wait(WAIT_S), "a second busy test waited for the first"
    first.let_go()
    second.let_go()


def test_a_measuring_test_waits_for_the_busy_ones_and_runs_alone(locks: Path) -> None:
    log: list[str] = []
    busy, measuring = Holder("busy", False, log), Holder("measuring", True, log)
    busy.start()
    assert busy.inside.wait(WAIT_S)
    measuring.start()
    until(lambda: turnstile_taken(locks), "the measuring test never queued")
    assert not measuring.inside.is_set()
    # A busy test arriving now waits behind the measuring one, although the lock is shared.
    late = Holder("late", False, log)
    late.start()
    busy.let_go()
    assert measuring.inside.wait(WAIT_S)
    assert not late.inside.is_set(), log
    measuring.let_go()
    assert late.inside.wait(WAIT_S)
    late.let_go()
    assert log == ["busy in", "busy out", "measuring in", "measuring out", "late in", "late out"]


def test_one_after_another_nothing_is_locked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quiet.LOCKS_VARIABLE, raising=False)
    with quiet.hold(exclusive=False), quiet.hold(exclusive=True):
        pass  # would wait forever if a lock were taken


def test_a_run_makes_its_lock_directory_and_removes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(quiet.LOCKS_VARIABLE, raising=False)
    quiet.start()
    locks = Path(os.environ[quiet.LOCKS_VARIABLE])
    with quiet.hold(exclusive=True):
        assert (locks / "lock").exists()
    quiet.finish()
    assert not locks.exists() and quiet.LOCKS_VARIABLE not in os.environ
