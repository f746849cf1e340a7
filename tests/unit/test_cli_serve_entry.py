"""`rallypoint serve` through the console-script entry point: Settings, failures, imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rallypoint import cli
from rallypoint.cli import serve
from rallypoint.errors import PortError
from rallypoint.settings import Settings
from tests.support.env import child_env

BENCH_ARGS = ["--no-mdns", "--local-host", "127.0.0.1", "--local-port", "7790",
              "--peer-host", "127.0.0.1", "--peer-port", "7791"]  # fmt: skip


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Settings]]:
    """The Settings each `serve` would have run the sidecar with (the sidecar is not run)."""
    calls: list[Settings] = []
    monkeypatch.setattr(serve, "run_sidecar", lambda built, environ: calls.append(built))
    for key in [key for key in os.environ if key.startswith("RALLYPOINT_")]:
        monkeypatch.delenv(key)
    yield calls


def _main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["rallypoint", *argv])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return int(exit_info.value.code or 0)


def test_entry_point_runs_the_sidecar_with_flag_over_variable_over_default(
    monkeypatch: pytest.MonkeyPatch, ran: list[Settings]
) -> None:
    monkeypatch.setenv("RALLYPOINT_DEADLINE", "7")
    monkeypatch.setenv("RALLYPOINT_LONG_POLL", "4")
    assert _main(monkeypatch, ["serve", *BENCH_ARGS, "--deadline", "9"]) == 0
    assert len(ran) == 1
    assert (ran[0].deadline_s, ran[0].long_poll_s) == (9.0, 4.0)
    assert ran[0].backoff_max_s == Settings().backoff_max_s


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"RALLYPOINT_STRICT_SELF": "maybe"}, "RALLYPOINT_STRICT_SELF"),
        ({"RALLYPOINT_TOKEN": "a", "RALLYPOINT_TOKEN_FILE": "/etc/hostname"}, "keep one"),
        ({"RALLYPOINT_PORT_RANGE": "1-99999"}, "RALLYPOINT_PORT_RANGE"),
    ],
)
def test_bad_variables_exit_2_with_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ran: list[Settings],
    environ: dict[str, str],
    needle: str,
) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert _main(monkeypatch, ["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and needle in err
    assert len(err.strip().splitlines()) == 1
    assert not ran


@pytest.mark.parametrize(
    ("failure", "code", "last_line"),
    [
        (PortError("port 7781 is taken"), 1, "error: port 7781 is taken"),
        (RuntimeError("boom"), 1, "error: unexpected RuntimeError: boom (rerun with --verbose"),
        (KeyboardInterrupt(), 130, "error: interrupted"),
    ],
)
@pytest.mark.parametrize("verbose", [False, True])
def test_a_failing_sidecar_is_one_error_line_and_a_traceback_only_with_verbose(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: BaseException,
    code: int,
    last_line: str,
    verbose: bool,
) -> None:
    def fail(built: Settings, environ: dict[str, str]) -> None:
        raise failure

    monkeypatch.setattr(serve, "run_sidecar", fail)
    argv = ["serve", *BENCH_ARGS, *(["--verbose"] if verbose else [])]
    assert _main(monkeypatch, argv) == code
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(last_line)
    traced = verbose and not isinstance(failure, KeyboardInterrupt)
    assert ("Traceback (most recent call last)" in err) is traced


# --- what `serve` imports before the sidecar starts ---------------------------------------

_PROBE = """
import json, sys
from rallypoint.cli import serve
def run_sidecar(settings, environ):
    import rallypoint.sidecar  # what serve imports before its listeners bind
    print(json.dumps({"ran": True, "modules": sorted(sys.modules)}))
serve.run_sidecar = run_sidecar
sys.argv = ["rallypoint", *json.loads(sys.argv[1])]
from rallypoint.cli import main
try:
    main()
finally:
    print(json.dumps({"ran": False, "modules": sorted(sys.modules)}))
"""
#: What only the client commands use: a sidecar's start does not pay for it.
NOT_FOR_SERVE = ("rallypoint.cli.client", "rallypoint.cli.meshview", "rallypoint.cli.progress")


def _imports(argv: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(argv)],
        env={**child_env(), "PYTHONPATH": str(Path(__file__).parents[2] / "src")},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert reports, proc.stderr
    first = reports[0]
    assert isinstance(first, dict)
    return first


def test_serve_imports_no_client_command_module() -> None:
    seen = _imports(["serve", *BENCH_ARGS])
    assert seen["ran"]
    assert "rallypoint.sidecar" in seen["modules"]
    assert [name for name in NOT_FOR_SERVE if name in seen["modules"]] == []


def test_the_import_probe_sees_the_client_modules_when_a_client_command_runs() -> None:
    seen = _imports(["status", "--url", "http://127.0.0.1:9", "--json"])
    assert not seen["ran"]
    assert "rallypoint.cli.client" in seen["modules"]
