"""`rallypoint wait --hostfile FILE` against a scripted local API on loopback."""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.served import render
from tests.support.cli import run
from tests.support.localapi import VALUES, FakeLocalAPI

HOSTFILE = "main1 slots=2\nsub1 slots=2\nsub2 slots=2\n"


class HostfileAPI(FakeLocalAPI):
    """The scripted local API, plus GET /hostfile once ready (or a fixed answer)."""

    def __init__(self, *, ready_after: int = 0, hostfile: tuple[int, str] | None = None) -> None:
        super().__init__(ready_after=ready_after)
        self.hostfile = hostfile

    def answer(self, path: str) -> tuple[int, str]:
        if path.partition("?")[0] != "/hostfile":
            return super().answer(path)
        if self.hostfile is not None:
            return self.hostfile
        return (200, HOSTFILE) if self.ready else (503, json.dumps({"ready": False}))


@pytest.fixture
def api() -> Iterator[HostfileAPI]:
    fake = HostfileAPI(ready_after=1)
    yield fake
    fake.close()


def test_hostfile_and_env_are_both_written(api: HostfileAPI, tmp_path: Path) -> None:
    hostfile, out = tmp_path / "hostfile", tmp_path / "env.sh"
    result = run(
        ["wait", "--url", api.url, "--hostfile", str(hostfile), "--out", str(out), "--format", "sh"]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert hostfile.read_text() == HOSTFILE
    assert out.read_text() == render.render(VALUES, "sh")
    assert stat.S_IMODE(hostfile.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.sh", "hostfile"]


def test_hostfile_alone_keeps_the_env_on_stdout(api: HostfileAPI, tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    result = run(["wait", "--url", api.url], env={"RALLYPOINT_WAIT_HOSTFILE": str(hostfile)})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == VALUES
    assert hostfile.read_text() == HOSTFILE


@pytest.mark.parametrize("where", ["missing-dir", "is-a-directory"])
def test_an_unwritable_hostfile_fails_at_once_and_writes_nothing(
    tmp_path: Path, where: str
) -> None:
    never = HostfileAPI(ready_after=10**6)  # the check comes before any wait
    try:
        hostfile = tmp_path / "missing" / "hostfile" if where == "missing-dir" else tmp_path
        out = tmp_path / "env.sh"
        result = run(
            ["wait", "--url", never.url, "--timeout", "60", "--hostfile", str(hostfile),
             "--out", str(out)]
        )  # fmt: skip
        assert result.exit_code == 2
        assert result.stderr.count("\n") == 1
        assert result.stderr.startswith(f"error: --hostfile {str(hostfile)!r} cannot be written")
        assert not out.exists()
        assert not any(path.startswith("/env") for path in never.paths)
    finally:
        never.close()


def test_an_env_variable_is_named_when_it_holds_the_bad_path(tmp_path: Path) -> None:
    bad = str(tmp_path / "missing" / "hostfile")
    result = run(["wait", "--url", "http://127.0.0.1:9"], env={"RALLYPOINT_WAIT_HOSTFILE": bad})
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: RALLYPOINT_WAIT_HOSTFILE {bad!r} cannot be written")


def test_no_slot_count_is_exit_2_and_nothing_is_written(tmp_path: Path) -> None:
    message = "PET_NPROC_PER_NODE='gpu' is not a number of processes"
    fake = HostfileAPI(hostfile=(409, json.dumps({"error": message, "code": "no_hostfile"})))
    try:
        hostfile, out = tmp_path / "hostfile", tmp_path / "env.sh"
        result = run(["wait", "--url", fake.url, "--hostfile", str(hostfile), "--out", str(out)])
        assert result.exit_code == 2
        # The sidecar was ready (the progress line may say so); the one error says why not.
        lines = result.stderr.splitlines()
        assert lines[-1] == f"error: {message}"
        assert all(line.startswith("rallypoint: ") for line in lines[:-1]), lines
        assert list(tmp_path.iterdir()) == []
    finally:
        fake.close()
