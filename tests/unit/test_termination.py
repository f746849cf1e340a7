"""The termination message `run` leaves for Kubernetes (cli/termination.py)."""

from __future__ import annotations

from pathlib import Path

from rallypoint.cli import termination

LINE = "rallypoint: first failure: sub2 (rank 2) exited 1: RuntimeError: x; exit 1"


def test_the_first_failure_line_is_written_without_the_prefix(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_text("an older message that is longer than the new one" * 10)
    said: list[str] = []
    assert termination.write(str(path), LINE, said.append)
    assert path.read_text() == LINE.removeprefix("rallypoint: ") + "\n" and not said


def test_at_most_what_the_kubelet_shows_is_written(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert termination.write(str(path), "x" * 10_000, lambda _: None)
    assert len(path.read_bytes()) == termination.MAX_BYTES


def test_a_path_that_cannot_be_written_is_said_once_and_nothing_else(tmp_path: Path) -> None:
    said: list[str] = []
    assert not termination.write(str(tmp_path / "no" / "such" / "dir"), LINE, said.append)
    assert len(said) == 1 and "cannot write the termination message" in said[0]


def test_without_a_path_nothing_is_written_where_kubernetes_made_no_file() -> None:
    if not Path(termination.DEFAULT).exists():
        assert not termination.write(None, LINE, lambda _: None)
