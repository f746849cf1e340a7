"""What the CLI writes: atomic env files, the status table."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from rallypoint.cli import output
from rallypoint.cli import status as cli_status
from tests.support.shown import status_view

SIZE = 1 << 20  # big enough that a plain write would be seen half-done


def test_a_reader_never_sees_a_half_written_file(tmp_path: Path) -> None:
    target = tmp_path / "env"
    contents = [letter * SIZE for letter in "ABCD"]
    stop = threading.Event()
    seen: list[str] = []
    torn: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                text = target.read_text()
            except FileNotFoundError:
                continue
            seen.append(text[:1])
            if len(text) != SIZE or text != text[0] * SIZE:
                torn.append(len(text))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for round_ in range(12):
            output.write_atomic_all([(target, contents[round_ % len(contents)])])
    finally:
        stop.set()
        thread.join()
    assert torn == []
    assert seen  # the reader did look at the file while it was being replaced
    assert target.read_text() == contents[11 % len(contents)]


def test_write_atomic_sets_mode_0644_whatever_the_umask(tmp_path: Path) -> None:
    target = tmp_path / "env"
    old = os.umask(0o077)
    try:
        output.write_atomic_all([(target, "A=1\n")])
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert os.listdir(tmp_path) == ["env"]


def test_write_atomic_leaves_no_temporary_file_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "env"
    target.write_text("OLD\n")

    def refuse(src: str, dst: str) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(output.Unwritable) as failed:
        output.write_atomic_all([(target, "NEW\n")])
    assert isinstance(failed.value.error, PermissionError)
    assert target.read_text() == "OLD\n"
    assert os.listdir(tmp_path) == ["env"]


def test_format_status_tolerates_a_minimal_document() -> None:
    text = cli_status.format_status(status_view({"ready": True}))
    assert text.split() == ["ready", "yes"]


def _peer(**fields: object) -> dict[str, object]:
    base = {"rank": 0, "host": "n0", "joined": True, "verdict": "loopback"}
    return {**base, **fields}


_FACT = "n0 resolves to loopback 127.0.1.1 (answers: 127.0.1.1)"
_LOOPBACK = f"{_FACT}; map the name to the node's cluster address"


def test_an_excused_verdict_reads_as_fine_and_explains_why_without_a_remedy() -> None:
    # /status gives an excused verdict's detail without its remedy (rendezvous/status.py).
    doc = {"ready": True, "peers": [_peer(detail=_FACT, excused="a single node")]}
    plain = cli_status.format_status(status_view(doc))
    assert "loopback (fine)" in plain
    assert "DETAIL" not in plain  # nothing left to say in it
    explained = cli_status.format_status(status_view(doc), explain=True)
    assert f"{_FACT}; fine: a single node" in explained
    assert "map the name" not in explained


def test_a_verdict_that_is_a_problem_keeps_its_remedy() -> None:
    doc = {"ready": False, "peers": [_peer(detail=_LOOPBACK, excused=None)]}
    shown = status_view(doc)
    for text in (cli_status.format_status(shown), cli_status.format_status(shown, explain=True)):
        assert "(fine)" not in text
        assert "map the name" in text


def test_status_shows_the_job_and_its_first_failure() -> None:
    node = {"rank": 2, "host": "sub2", "state": "exited", "what": "exited 3"}
    job = {
        "counts": {"waiting": 1, "running": 2, "exited": 1},
        "first": {**node, "ago_s": 4.25},
        "nodes": [node, {"rank": 0, "host": "main1", "state": "running", "what": "running"}],
    }
    text = cli_status.format_status(status_view({"ready": True, "job": job}))
    assert "job: 2 running, 1 exited, 1 not started" in text
    assert "first failure: sub2 (rank 2) exited 3, 4.2 s ago" in text
    assert "  - main1 (rank 0): running" in text


def test_status_shows_the_attempt_and_each_earlier_attempt_s_first_failure() -> None:
    crash = {"rank": 2, "host": "sub2", "state": "exited", "what": "exited 3", "attempt": 0}
    lost = {"rank": 1, "host": "sub1", "state": "lost", "what": "lost: x", "attempt": 1}
    job = {
        "attempt": 2,
        "counts": {"waiting": 0, "running": 3},
        "first": None,
        "attempts": [{**crash, "ago_s": 60.0}, {**lost, "ago_s": 20.0}],
        "nodes": [],
    }
    text = cli_status.format_status(status_view({"ready": True, "job": job}))
    assert "job: attempt 2: 3 running" in text
    assert "  attempt 0: first failure sub2 (rank 2) exited 3, 60.0 s ago" in text
    assert "  attempt 1: first failure sub1 (rank 1) lost: x, 20.0 s ago" in text
    assert "  first failure:" not in text


def test_status_says_nothing_of_a_job_nobody_runs() -> None:
    job = {"counts": {"waiting": 3}, "first": None, "nodes": []}
    assert "job" not in cli_status.format_status(status_view({"ready": True, "job": job}))
