"""The job's progress file (cli/progressfile.py): marks read back, stalls decided, bad files
read as "no progress written" and said once."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint.cli import client, progressfile, progresspost, rules
from rallypoint.cli.progressfile import Bounds, Mark, Unreadable, Watch, parse, read, where
from rallypoint.wire import jobstates


def test_a_touch_is_progress_without_a_step() -> None:
    assert parse(b"", 12.5) == Mark(12.5)
    assert parse(b"\n", 12.5) == Mark(12.5)


def test_a_step_and_an_optional_phase() -> None:
    assert parse(b"1234", 1.0) == Mark(1.0, 1234, "")
    assert parse(b"1234 checkpoint\n", 1.0) == Mark(1.0, 1234, "checkpoint")
    assert where(Mark(1.0, 1234, "checkpoint")) == "at step 1234 (checkpoint)"
    assert where(Mark(1.0, 7)) == "at step 7"
    assert where(Mark(1.0)) == ""


@pytest.mark.parametrize(
    "data",
    [b"step 12", b"-3", b"12 two words", b"12 \xff", b"\xff\xfe", b"1" * 19, b"12 " + b"p" * 33],
)
def test_text_that_is_not_a_step_is_unreadable(data: bytes) -> None:
    with pytest.raises(Unreadable):
        parse(data, 1.0)


@given(st.binary(max_size=progressfile.MAX_READ + 8))
def test_any_bytes_give_a_mark_or_unreadable(data: bytes) -> None:
    try:
        mark = parse(data, 3.0)
    except Unreadable as exc:
        assert str(exc)
        return
    assert mark.at == 3.0 and (mark.step is None or mark.step >= 0)


def test_the_file_is_read_with_its_mtime_and_a_missing_one_is_none(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    assert read(str(path)) is None
    path.write_text("41 data\n")
    os.utime(path, (1000.0, 1000.0))
    assert read(str(path)) == Mark(1000.0, 41, "data")


def test_a_directory_a_symlink_and_a_file_that_grew_are_unreadable(tmp_path: Path) -> None:
    folder = tmp_path / "dir"
    folder.mkdir()
    target = tmp_path / "target"
    target.write_text("3")
    link = tmp_path / "link"
    link.symlink_to(target)
    big = tmp_path / "big"
    big.write_text("1\n" * progressfile.MAX_READ)
    for path in (folder, link, big):
        with pytest.raises(Unreadable):
            read(str(path))


def watch(
    path: Path, every_s: float | None, first_s: float | None, checkpoint_s: float | None = None
) -> tuple[Watch, list[str]]:
    said: list[str] = []
    bounds = Bounds(every_s, first_s, checkpoint_s)
    return Watch(str(path), 100.0, bounds, said.append), said


def test_no_progress_within_the_bound_after_the_last_mark_is_a_stall(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    progress, _ = watch(path, every_s=10.0, first_s=None)
    assert progress.look(now=5000.0) is None  # never marked: not watched without first_s
    path.write_text("12 step")
    os.utime(path, (200.0, 200.0))
    assert progress.look(now=209.0) is None
    stall = progress.look(now=211.0)
    assert stall is not None and stall.last == Mark(200.0, 12, "step")
    assert stall.detail == "at step 12 (step), no progress for 10 s"
    assert stall.silent_s == 11.0  # the age the look found; the line names the bound


def test_the_first_bound_applies_until_the_first_mark(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    progress, _ = watch(path, every_s=None, first_s=30.0)
    assert progress.look(now=129.0) is None
    stall = progress.look(now=131.0)
    assert stall is not None and stall.last is None and stall.began == 100.0
    assert stall.detail == "before its first progress, 30 s after the start"
    path.touch()
    os.utime(path, (131.5, 131.5))
    # Marked once: without --stall-timeout nothing is watched after the first mark.
    assert progress.look(now=10_000.0) is None


def test_a_bad_file_is_said_once_and_is_no_progress(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    progress, said = watch(path, every_s=10.0, first_s=20.0)
    path.mkdir()
    assert progress.look(now=110.0) is None
    stall = progress.look(now=121.0)
    assert stall is not None and stall.last is None
    assert len(said) == 1 and "is not a regular file" in said[0], said


def test_a_checkpoint_mark_has_its_own_bound(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    progress, _ = watch(path, every_s=10.0, first_s=None, checkpoint_s=60.0)
    path.write_text("12 checkpoint")
    os.utime(path, (200.0, 200.0))
    assert progress.look(now=250.0) is None  # a long save within its bound
    stall = progress.look(now=261.0)
    assert stall is not None and stall.detail == "at step 12 (checkpoint), no progress for 60 s"
    path.write_text("13 step")
    os.utime(path, (300.0, 300.0))
    assert progress.look(now=311.0) is not None  # the step's bound again


def test_without_a_checkpoint_bound_a_checkpoint_is_a_step() -> None:
    assert Bounds(10.0).after(Mark(1.0, 3, "checkpoint")) == 10.0
    assert Bounds(10.0, None, 60.0).after(Mark(1.0, 3, "checkpoint")) == 60.0
    assert Bounds(10.0, None, 60.0).after(Mark(1.0, 3, "data")) == 10.0
    assert not Bounds().watching and Bounds(None, None, 60.0).watching


@pytest.mark.parametrize(
    ("text", "number"), [("USR1", 10), ("sigusr2", 12), ("SIGQUIT", 3), ("15", 15)]
)
def test_a_stall_signal_is_named_or_numbered(text: str, number: int) -> None:
    assert rules.SignalName()(text) == number


@pytest.mark.parametrize("text", ["KILL", "SIGSTOP", "9", "NOPE", "", "0", "999", "USR1x"])
def test_a_stall_signal_a_job_cannot_catch_is_refused(text: str) -> None:
    with pytest.raises(rules.Invalid, match="is not a signal a job can catch"):
        rules.SignalName()(text)


def mark_at(path: Path, text: str, at: float) -> None:
    path.write_text(text)
    os.utime(path, (at, at))


def test_with_local_ranks_files_the_node_is_its_oldest_local_rank(tmp_path: Path) -> None:
    path = tmp_path / "progress-attempt-0"
    mark_at(Path(f"{path}.0"), "12 step", 300.0)
    mark_at(Path(f"{path}.1"), "11 data", 250.0)
    mark_at(Path(f"{path}.12"), "12 step", 301.0)
    for stray in ("progress-attempt-0.x", "progress-attempt-0.99999", "progress-attempt-1.0"):
        mark_at(tmp_path / stray, "1", 1.0)  # not a local rank of this file
    assert progressfile.local_ranks(str(path)) == [0, 1, 12]
    assert progressfile.read_node(str(path)) == Mark(250.0, 11, "data", 1)
    progress, _ = watch(path, every_s=10.0, first_s=None)
    stall = progress.look(now=261.0)
    assert (
        stall is not None
        and stall.detail == "at step 11 (data), local rank 1, no progress for 10 s"
    )


def test_the_time_between_two_marks_is_the_jobs_phase(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    progress, _ = watch(path, every_s=None, first_s=None)
    mark_at(path, "1 data", 200.0)
    progress.look(now=200.1)
    assert progress.period_s is None
    mark_at(path, "1 collective", 200.5)
    progress.look(now=200.6)
    assert progress.period_s == 0.5


def test_a_local_ranks_bad_file_is_said_once(tmp_path: Path) -> None:
    path = tmp_path / "progress"
    mark_at(path, "3", 100.0)
    Path(f"{path}.0").mkdir()
    progress, said = watch(path, every_s=10.0, first_s=None)
    assert progress.look(now=105.0) is None
    assert progress.look(now=106.0) is None
    assert len(said) == 1 and "is not a regular file" in said[0], said


def test_the_publisher_posts_the_newest_mark_and_never_drops_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marks offered faster than once per PUBLISH_S: the first goes at once, the last one
    offered goes at the next turn, those between are replaced."""
    posted: list[jobstates.ProgressReport] = []
    monkeypatch.setattr(
        client,
        "report_progress",
        lambda url, body, **_: posted.append(jobstates.parse_progress(body)),
    )
    monkeypatch.setattr(progresspost, "PUBLISH_S", 0.3)
    publisher = progresspost.Publisher("http://127.0.0.1:1", attempt=4)
    over = threading.Event()
    thread = threading.Thread(target=publisher.run, args=(over,))
    thread.start()
    try:
        publisher.offer(Mark(10.0, 1))
        deadline = time.monotonic() + 5.0
        while not posted and time.monotonic() < deadline:
            time.sleep(0.01)
        for step in range(2, 6):
            publisher.offer(Mark(10.0 + step, step, "step", 2))
        while len(posted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        over.set()
        thread.join(5.0)
    assert [(p.attempt, p.step) for p in posted] == [(4, 1), (4, 5)], posted
    assert posted[1] == jobstates.ProgressReport(4, 15.0, 5, "step", 2)
