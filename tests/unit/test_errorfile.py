"""The cause a failed child leaves in its error file (cli/errorfile.py), read back as one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from rallypoint.cli import errorfile
from rallypoint.cli.errorfile import ErrorFiles, parse_cause, read_cause
from rallypoint.wire.jobstates import MAX_CAUSE


def torch_file(message: object, **extra: object) -> bytes:
    """What torch's ErrorHandler.record_exception writes (and torchrun's copy of it)."""
    inner = {"message": message, "extraInfo": {"py_callstack": "Traceback ...\n", "timestamp": "1"}}
    return json.dumps({"message": {**inner, **extra}}).encode()


def test_torchs_json_gives_the_exception_type_and_message() -> None:
    data = torch_file("RuntimeError: planted failure at step 4")
    assert parse_cause(data) == "RuntimeError: planted failure at step 4"


def test_torchruns_copy_names_the_workers_own_status() -> None:
    assert parse_cause(torch_file("ValueError: bad batch", errorCode=3)) == (
        "ValueError: bad batch (worker exit 3)"
    )
    assert parse_cause(torch_file("RuntimeError: x", errorCode=-9)) == (
        "RuntimeError: x (worker signal 9)"
    )


def test_a_plain_file_gives_its_first_line_that_says_something() -> None:
    assert parse_cause(b"\n  \nout of disk on /scratch\nmore\n") == "out of disk on /scratch"


def test_a_multi_line_message_becomes_one_line_of_printable_text() -> None:
    data = torch_file("AssertionError: a\n\tb\x1b[31m red\x00")
    assert parse_cause(data) == "AssertionError: a b [31m red"


def test_a_long_cause_is_cut_to_the_bound() -> None:
    cause = parse_cause(("x" * 5000).encode())
    assert len(cause) == MAX_CAUSE and cause.endswith("...")


def test_nothing_readable_is_no_cause() -> None:
    assert parse_cause(b"") == ""
    assert parse_cause(b"\n\n") == ""
    assert parse_cause(json.dumps({"message": {"extraInfo": {}}}).encode()) == json.dumps(
        {"message": {"extraInfo": {}}}
    )  # JSON that is not torch's: its first line, as any text


@given(st.binary(max_size=4096))
def test_any_bytes_give_one_bounded_line(data: bytes) -> None:
    cause = parse_cause(data)
    assert len(cause) <= MAX_CAUSE and "\n" not in cause and cause.isprintable()


def test_only_a_regular_file_written_since_the_attempt_began_is_read(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    assert read_cause(str(path)) == ""  # none written
    path.write_bytes(b"disk full")
    assert read_cause(str(path)) == "disk full"
    assert read_cause(str(path), since=time.time() + 60) == ""  # an older attempt's
    link = tmp_path / "link"
    link.symlink_to(path)
    assert read_cause(str(link)) == ""  # never followed
    (tmp_path / "dir").mkdir()
    assert read_cause(str(tmp_path / "dir")) == ""
    os.mkfifo(tmp_path / "fifo")
    assert read_cause(str(tmp_path / "fifo")) == ""  # not waited on


def test_a_huge_file_is_read_only_up_to_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    path.write_bytes(b"y" * (errorfile.MAX_READ * 4))
    assert len(read_cause(str(path))) == MAX_CAUSE


def test_each_attempt_gets_a_fresh_file_in_the_runs_own_directory() -> None:
    files = ErrorFiles({})
    first = files.for_attempt(0, time.time())
    assert first["RALLYPOINT_ERROR_FILE"] == first["TORCHELASTIC_ERROR_FILE"]
    Path(first["RALLYPOINT_ERROR_FILE"]).write_text("attempt 0 failed")
    assert files.cause() == "attempt 0 failed"
    second = files.for_attempt(1, time.time())
    assert second["RALLYPOINT_ERROR_FILE"] != first["RALLYPOINT_ERROR_FILE"]
    assert files.cause() == ""  # attempt 0's cause is not attempt 1's
    directory = Path(first["RALLYPOINT_ERROR_FILE"]).parent
    files.remove()
    assert not directory.exists()


def test_the_users_own_torch_error_file_is_kept_and_read(tmp_path: Path) -> None:
    own = tmp_path / "mine.json"
    files = ErrorFiles({"TORCHELASTIC_ERROR_FILE": str(own)})
    began = time.time() - 1
    assert files.for_attempt(0, began) == {"RALLYPOINT_ERROR_FILE": str(own)}
    own.write_bytes(torch_file("KeyError: 'lr'"))
    assert files.cause() == "KeyError: 'lr'"
    files.remove()
    assert own.exists()
