"""`wait`, `env`, `check`, `exec`, `status` against a scripted local API on loopback."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.cli import client
from rallypoint.errors import NotReady, RendezvousTimeout, SidecarError, SidecarUnreachable
from rallypoint.served import render
from tests.support.cli import rallypoint, run
from tests.support.localapi import STATUS, VALUES, FakeLocalAPI
from tests.support.ports import free_port


@pytest.fixture
def fake() -> Iterator[FakeLocalAPI]:
    api = FakeLocalAPI(ready_after=2)
    yield api
    api.close()


# --- wait ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "sh", "dotenv"])
def test_wait_long_polls_until_ready_then_prints(fake: FakeLocalAPI, fmt: str) -> None:
    result = run(["wait", "--url", fake.url, "--timeout", "30", "--format", fmt])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == render.render(VALUES, fmt)
    env_requests = [p for p in fake.paths if p.startswith("/env")]
    assert len(env_requests) == 3
    assert all("wait=" in p and f"format={fmt}" in p for p in env_requests)


def test_wait_retries_until_the_sidecar_starts_listening() -> None:
    port = free_port()
    started: list[FakeLocalAPI] = []
    timer = threading.Timer(0.5, lambda: started.append(FakeLocalAPI(port)))
    timer.start()
    try:
        result = run(["wait", "--local-port", str(port), "--timeout", "30"])
    finally:
        timer.join()
        for api in started:
            api.close()
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == VALUES


def test_wait_ignores_http_proxy_variables(fake: FakeLocalAPI) -> None:
    proxy = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    result = run(["wait", "--url", fake.url, "--timeout", "30"], proxy)
    assert result.exit_code == 0, result.stderr


def test_wait_times_out_with_exit_3_against_a_closed_port() -> None:
    port = free_port()
    proc = rallypoint("wait", "--local-port", str(port), "--timeout", "0.5")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    said, error = proc.stderr.splitlines()
    # The time since the wait began: 0.0s, or a little more on a busy machine.
    elapsed, _, said = said.partition("] ")
    assert re.fullmatch(r"rallypoint: \[0\.\ds", elapsed), elapsed
    assert said == f"no sidecar answers on 127.0.0.1:{port}: start " \
        "`rallypoint serve` (or point --url / --local-port at the one that runs)"  # fmt: skip
    assert error.startswith("error: not ready after 0.5s: ")
    assert f"no sidecar answers on 127.0.0.1:{port}" in error
    # One cause and one remedy: the sidecar's own, with no hint added after it.
    assert error.endswith("(or point --url / --local-port at the one that runs)")


def test_wait_quiet_prints_only_the_error_line() -> None:
    port = free_port()
    proc = rallypoint("wait", "--local-port", str(port), "--timeout", "0.5", "--quiet")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.startswith("error: not ready after 0.5s: ")
    assert proc.stderr.count("\n") == 1


def test_wait_says_each_change_then_how_long_it_took(fake: FakeLocalAPI) -> None:
    result = run(["wait", "--url", fake.url, "--timeout", "30"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == VALUES  # stdout is the env only
    lines = result.stderr.splitlines()
    # Two not-ready answers with the same reasons: one line, and the last says the time.
    assert len(lines) == 2, lines
    assert re.fullmatch(
        r"rallypoint: \[\d+\.\ds\] waiting_for_peers: 1 of 2 nodes joined; joined 1/2", lines[0]
    )
    assert re.fullmatch(r"rallypoint: ready after \d+\.\ds", lines[1])
    # The counts come from one /status, fetched when the reasons changed, not every poll.
    assert fake.paths.count("/status") == 1
    assert all("wait=1.000" in p for p in fake.paths if p.startswith("/env"))


def test_wait_quiet_keeps_long_polls_and_says_nothing(fake: FakeLocalAPI) -> None:
    result = run(["wait", "--url", fake.url, "--timeout", "30", "--quiet"])
    assert result.exit_code == 0, result.stderr
    assert result.stderr == ""
    assert "/status" not in fake.paths
    waits = [float(p.partition("wait=")[2]) for p in fake.paths if p.startswith("/env")]
    assert min(waits) > 20  # the 30s long-poll, less the time spent


def test_wait_times_out_naming_the_first_reason_once() -> None:
    api = FakeLocalAPI(ready_after=10**6)
    try:
        result = run(["wait", "--url", api.url, "--timeout", "0.3", "--quiet"])
    finally:
        api.close()
    assert result.exit_code == 3
    assert result.stderr == "error: not ready after 0.3s: waiting_for_peers: 1 of 2 nodes joined\n"


def test_wait_times_out_with_the_last_reason_when_never_ready() -> None:
    api = FakeLocalAPI(ready_after=10**6)
    try:
        result = run(["wait", "--url", api.url, "--timeout", "0.3"])
    finally:
        api.close()
    assert result.exit_code == 3
    assert "waiting_for_peers: 1 of 2 nodes joined" in result.stderr


def test_wait_stops_at_once_on_an_answer_outside_the_contract() -> None:
    api = FakeLocalAPI(status=404)
    try:
        result = run(["wait", "--url", api.url, "--timeout", "30"])
    finally:
        api.close()
    assert result.exit_code == 1
    assert len(api.paths) == 1
    assert "answered 404" in result.stderr


def test_wait_out_writes_the_file_atomically_with_mode_0644(
    fake: FakeLocalAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "rallypoint.env"
    target.write_text("OLD=1\n")
    replaced: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        # The target still holds the old, complete file when the new one is moved in.
        assert target.read_text() == "OLD=1\n"
        assert Path(src).parent == tmp_path
        assert Path(src).read_text() == render.render(VALUES, "dotenv")
        replaced.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    result = run(["wait", "--url", fake.url, "--out", str(target), "--format", "dotenv"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    assert replaced == [(replaced[0][0], str(target))]
    assert target.read_text() == render.render(VALUES, "dotenv")
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rallypoint.env"]


def test_wait_out_into_a_missing_directory_is_one_error_line(
    fake: FakeLocalAPI, tmp_path: Path
) -> None:
    target = tmp_path / "missing" / "env"
    result = run(["wait", "--url", fake.url, "--out", str(target)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: --out {str(target)!r} cannot be written")


# --- env, check, status ------------------------------------------------------------------------


def test_env_prints_when_ready_and_exits_1_with_reasons_when_not() -> None:
    api = FakeLocalAPI(ready_after=1)
    try:
        first = run(["env", "--url", api.url, "--format", "sh"])
        second = run(["env", "--url", api.url, "--format", "sh"])
    finally:
        api.close()
    assert first.exit_code == 1
    assert first.stdout == ""
    assert first.stderr.startswith("error: the sidecar on 127.0.0.1:")
    assert "waiting_for_peers: 1 of 2 nodes joined" in first.stderr
    assert second.exit_code == 0
    assert second.stdout == render.render(VALUES, "sh")


def test_check_exits_1_when_nothing_listens() -> None:
    port = free_port()
    proc = rallypoint("check", "--local-port", str(port))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"error: no sidecar answers on 127.0.0.1:{port}")
    assert proc.stderr.count("\n") == 1


@pytest.mark.parametrize(("ready_after", "code"), [(-1, 0), (0, 1)])
def test_check_follows_readyz(ready_after: int, code: int) -> None:
    api = FakeLocalAPI(ready_after=ready_after)
    try:
        result = run(["check", "--url", api.url])
    finally:
        api.close()
    assert result.exit_code == code
    assert result.stdout == ""
    assert api.paths == ["/readyz"]
    if code:
        assert "starting: x" in result.stderr
        assert "not ready: not ready" not in result.stderr


def test_status_renders_a_table_and_exits_1_when_not_ready(fake: FakeLocalAPI) -> None:
    result = run(["status", "--url", fake.url])
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    assert any(line.split() == ["ready", "no"] for line in lines)
    header = next(line for line in lines if line.startswith("RANK"))
    assert header.split() == ["RANK", "HOST", "JOINED", "ADDRESSES", "VERDICT", "RESOLVED",
                              "DETAIL"]  # fmt: skip
    row = next(line for line in lines if line.startswith("1 "))
    assert row.split()[:5] == ["1", "n1", "no", "-", "not_found"]
    assert "  - waiting_for_peers: 1 of 2 nodes joined" in lines
    assert "  - MASTER_PORT=29555 from --set (derived: 29500)" in lines
    assert any(line.split() == ["master", "port", "29555", "(held)"] for line in lines)


def test_status_json_is_the_raw_document(fake: FakeLocalAPI) -> None:
    result = run(["status", "--url", fake.url, "--json"])
    assert json.loads(result.stdout) == STATUS


# --- exec ------------------------------------------------------------------------------------


def test_exec_runs_the_command_with_the_env_merged_in(fake: FakeLocalAPI) -> None:
    code = "import os; e = os.environ; print(e['MASTER_ADDR'], e['TF_CONFIG'], e['KEEP'])"
    proc = rallypoint(
        "exec", "--url", fake.url, "--", sys.executable, "-c", code, env={"KEEP": "kept"}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [VALUES["MASTER_ADDR"], VALUES["TF_CONFIG"], "kept"]


def test_exec_passes_the_commands_exit_code_and_own_options(fake: FakeLocalAPI) -> None:
    proc = rallypoint("exec", "--url", fake.url, sys.executable, "-c", "raise SystemExit(7)")
    assert proc.returncode == 7, proc.stderr


def test_exec_of_a_missing_command_exits_127(fake: FakeLocalAPI) -> None:
    proc = rallypoint("exec", "--url", fake.url, "--", "no-such-command-rallypoint")
    assert proc.returncode == 127
    assert proc.stderr.splitlines()[-1] == (
        "error: 'no-such-command-rallypoint' not found: check the command and PATH"
    )
    assert proc.stderr.splitlines()[-2].startswith("rallypoint: ready after ")


def test_exec_quiet_leaves_stderr_to_the_command(fake: FakeLocalAPI) -> None:
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    proc = rallypoint("exec", "--quiet", "--url", fake.url, "--", sys.executable, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("out\n", "err\n")


def test_exec_stdout_is_the_commands_alone(fake: FakeLocalAPI) -> None:
    proc = rallypoint("exec", "--url", fake.url, "--", sys.executable, "-c", "print('out')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "out\n"
    assert proc.stderr.splitlines()[-1].startswith("rallypoint: ready after ")


# --- the client on its own -------------------------------------------------------------------


def test_client_errors_are_distinct() -> None:
    port = free_port()
    with pytest.raises(SidecarUnreachable, match="start `rallypoint serve`"):
        client.fetch_env(f"http://127.0.0.1:{port}")
    api = FakeLocalAPI(ready_after=10**6)
    try:
        with pytest.raises(NotReady, match="waiting_for_peers"):
            client.fetch_env(api.url)
        with pytest.raises(RendezvousTimeout):
            client.wait_env(api.url, "json", 0.2)
    finally:
        api.close()
    api = FakeLocalAPI(status=500)
    try:
        with pytest.raises(SidecarError, match="answered 500"):
            client.status(api.url)
    finally:
        api.close()


@pytest.mark.parametrize(
    ("host", "url"),
    [("127.0.0.1", "http://127.0.0.1:7"), ("::1", "http://[::1]:7"),
     ("0.0.0.0", "http://127.0.0.1:7"), ("::", "http://[::1]:7")],
)  # fmt: skip
def test_local_url(host: str, url: str) -> None:
    assert client.local_url(host, 7) == url
