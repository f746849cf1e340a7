"""`serve` without click: the same Settings as click's path, or click's own answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import click
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rallypoint import cli
from rallypoint.cli import config, fastserve, rules, specs
from rallypoint.cli import setup as cli_setup
from rallypoint.cli.commands import app
from rallypoint.errors import ConfigError, PortError
from rallypoint.settings import Settings
from tests.support.env import child_env

BENCH_ARGS = ["--no-mdns", "--local-host", "127.0.0.1", "--local-port", "7790",
              "--peer-host", "127.0.0.1", "--peer-port", "7791"]  # fmt: skip
VALUES = [
    "1", "0", "2", "80", "7780", "65535", "65536", "-1", "abc", "", " 5 ", "2.5", "0.01", "inf",
    "nan", "auto", "ALL", "master", "name", "ip", "text", "json", "xml", "torch", "tf,jax",
    "torch,mxnet", ",", "a b", "a,b", "::1", "127.0.0.1", "100-200", "5-2", " 1 - 9 ", "ps:2",
    "chief", "K=V", "=1", "NOEQ", "slurm", "yarn", "true", "off", "maybe", "128", "129",
    "--verbose", "-h", "--",
]  # fmt: skip
BOOLS = ["1", "0", "yes", "No", " TRUE ", "off", "t", "maybe", "2", " "]
FLAGS = [flag for spec in specs.SETTINGS for flag in spec.flags + spec.off_flags]
JUNK = ["--help", "-h", "--version", "--", "-", "x", "--local-por", "--no-such", "--verbose=1",
        "--mdns=0", "--no-verbose", "-v", "--Local-port"]  # fmt: skip
VARIABLES = sorted({spec.envvar for spec in specs.SETTINGS} | {"RALLYPOINT_TOKEN"})


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("token") / "token"
    path.write_text("from-file\n")
    return str(path)


GOOD = {
    "provider": ["slurm", " Explicit "], "local_hosts": ["::1", "127.0.0.1, ::1"],
    "peer_host": ["127.0.0.1", "node-a"], "port": ["7780", " 29500 "],
    "port_range": ["100-200", " 1 - 9 "], "seconds": ["2.5", "30"],
    "resolve_scope": ["all", "MASTER"], "master_addr_mode": ["ip", "name"],
    "frameworks": ["torch", "tf,jax"], "nproc_per_node": ["2", "8"],
    "tf_layout": ["chief", "ps:2"], "sets": ["A=1", "MASTER_PORT=29600"],
    "relay_group_size": ["auto", "0", "16"], "mdns_interfaces": ["lo", "eth0,lo"],
    "log_format": ["json", "text"],
}  # fmt: skip


def _good(spec: specs.Spec, token_file: str) -> list[str]:
    """Values this option takes (for a boolean flag, words its variable takes)."""
    if spec.is_flag:
        return BOOLS[:7]
    if spec.name == "token_file":
        return [token_file]
    if spec.name.endswith("_port"):
        return GOOD["port"]
    return GOOD.get(spec.name, GOOD["seconds"])


def _values(token_file: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([*VALUES, token_file, "/nonexistent/token"]),
        st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=8),
    )


def _good_item(spec: specs.Spec, token_file: str) -> st.SearchStrategy[list[str]]:
    if spec.is_flag:
        return st.sampled_from(spec.flags + spec.off_flags).map(lambda flag: [flag])
    value = st.sampled_from(_good(spec, token_file))
    return st.one_of(
        value.map(lambda v: [spec.flags[0], v]), value.map(lambda v: [f"{spec.flags[0]}={v}"])
    )


def _arguments(token_file: str) -> st.SearchStrategy[list[str]]:
    value = _values(token_file)
    good = st.one_of(*(_good_item(spec, token_file) for spec in specs.SETTINGS))
    bad = st.one_of(
        st.tuples(st.sampled_from(FLAGS), value).map(lambda fv: [fv[0], fv[1]]),
        st.tuples(st.sampled_from(FLAGS), value).map(lambda fv: [f"{fv[0]}={fv[1]}"]),
        st.sampled_from(JUNK).map(lambda junk: [junk]),
    )
    items = st.lists(good, max_size=6) | st.lists(st.one_of(good, bad), max_size=4)
    return items.map(lambda groups: [word for group in groups for word in group])


def _environments(token_file: str) -> st.SearchStrategy[dict[str, str]]:
    good = st.sampled_from(specs.SETTINGS).flatmap(
        lambda spec: st.tuples(st.just(spec.envvar), st.sampled_from(_good(spec, token_file)))
    )
    bad = st.tuples(
        st.sampled_from(VARIABLES),
        st.one_of(_values(token_file), st.sampled_from([*BOOLS, "K=V\n\nA=b c\n"])),
    )
    pairs = st.lists(good, max_size=5) | st.lists(st.one_of(good, bad), max_size=4)
    return pairs.map(dict)


def _click_path(args: list[str], environ: dict[str, str]) -> tuple[Any, ...] | None:
    """What click makes of serve's args in this environment; None when it refuses them."""
    command = app.commands["serve"]
    try:
        with command.make_context("serve", list(args)) as ctx:
            params, from_env = dict(ctx.params), cli_setup.from_env(ctx)
            return params, from_env, _outcome(lambda: cli_setup.build_settings(ctx, environ))
    except (click.exceptions.ClickException, click.exceptions.Exit):
        return None


def _outcome(build: Any) -> Settings | tuple[str, str]:
    try:
        built = build()
    except ConfigError as exc:
        return (type(exc).__name__, str(exc))
    assert isinstance(built, Settings)
    return built


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_falls_back_or_builds_what_click_builds(data: Any, token_file: str) -> None:
    args = data.draw(_arguments(token_file), label="args")
    environ = data.draw(_environments(token_file), label="environ")
    with mock.patch.dict(os.environ, environ, clear=True):
        fast = fastserve.parse(args, os.environ)
        slow = _click_path(args, environ)
    if fast is None:
        event("fast path falls back" + (" (click refuses too)" if slow is None else ""))
        return
    assert slow is not None, "the fast path accepted what click refuses"
    params, from_env = fast
    assert (params, from_env) == slow[:2]
    assert _outcome(lambda: config.build(params, from_env, environ)) == slow[2]
    event("fast path: same values as click")


@pytest.mark.parametrize(
    ("args", "environ"),
    [
        (BENCH_ARGS, {}),
        ([], {}),
        (["--deadline=7", "--set", "A=1", "--set=B=2 3", "--no-probe", "--probe"], {}),
        (["--local-host", "::1", "--local-host", "127.0.0.1,10.0.0.1"], {}),
        ([], {"RALLYPOINT_MDNS": " off ", "RALLYPOINT_SET": "A=1\n\nB=x y\n"}),
        (["--mdns"], {"RALLYPOINT_MDNS": "false", "RALLYPOINT_DEADLINE": "9"}),
        (["--peer-host", "--verbose"], {"RALLYPOINT_LOCAL_PORT": ""}),
        (["--relay-group", "auto", "--frameworks", "torch,jax", "--tf-layout", "PS:2"], {}),
    ],
)
def test_common_arguments_take_the_fast_path(args: list[str], environ: dict[str, str]) -> None:
    with mock.patch.dict(os.environ, environ, clear=True):
        fast = fastserve.parse(args, os.environ)
        slow = _click_path(args, environ)
    assert fast is not None
    assert slow is not None
    assert fast == slow[:2]
    assert config.build(*fast, environ) == slow[2]


def test_boolean_words_are_clicks() -> None:
    assert click.types.BoolParamType.bool_states == rules.BOOL_STATES


# --- the real entry point: the fast path runs the sidecar, or click answers ---------------


@pytest.fixture
def ran(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Settings]]:
    """The Settings each `serve` would have run the sidecar with (the sidecar is not run)."""
    calls: list[Settings] = []
    monkeypatch.setattr(fastserve, "run", lambda built, environ: calls.append(built))
    for key in [key for key in os.environ if key.startswith("RALLYPOINT_")]:
        monkeypatch.delenv(key)
    yield calls


def _main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["rallypoint", *argv])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    return int(exit_info.value.code or 0)


def _click_main(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> int:
    monkeypatch.setattr(sys, "argv", ["rallypoint", *argv])
    with pytest.raises(SystemExit) as exit_info:
        app.main(prog_name="rallypoint")
    return int(exit_info.value.code or 0)


def test_entry_point_runs_the_sidecar_with_clicks_settings(
    monkeypatch: pytest.MonkeyPatch, ran: list[Settings]
) -> None:
    with mock.patch.object(app, "main", None):  # the fast path must not need click
        assert _main(monkeypatch, ["serve", *BENCH_ARGS, "--deadline", "9"]) == 0
    assert _click_main(monkeypatch, ["serve", *BENCH_ARGS, "--deadline", "9"]) == 0
    assert len(ran) == 2
    assert ran[0] == ran[1]
    assert ran[0].deadline_s == 9.0


FALLBACKS = [
    ["serve", "--help"],
    ["serve", "-h"],
    ["serve", "--version"],
    ["serve", "--local-por", "1"],
    ["serve", "--no-such-flag"],
    ["serve", "--verbose=1"],
    ["serve", "--peer-port"],
    ["serve", "extra"],
    ["serve", "--local-port", "70000"],
    ["serve", "--frameworks", "torch,mxnet"],
    ["serve", "--backoff-initial", "3", "--backoff-max", "1"],
    ["serve", "--local-port", "7780", "--peer-port", "7780"],
    ["serve", "--token-file", "/nonexistent/token"],
    ["serve", "--local-host="],
    ["serve", "--", "x"],
]


@pytest.mark.parametrize("argv", FALLBACKS)
def test_what_the_fast_path_does_not_take_click_answers_as_before(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ran: list[Settings],
    argv: list[str],
) -> None:
    code = _main(monkeypatch, argv)
    fast = capsys.readouterr()
    assert _click_main(monkeypatch, argv) == code
    slow = capsys.readouterr()
    assert (fast.out, fast.err) == (slow.out, slow.err)
    assert code in (0, 2)
    assert (fast.out if code == 0 else fast.err).strip()  # click said something
    assert not ran


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"RALLYPOINT_STRICT_SELF": "maybe"}, "RALLYPOINT_STRICT_SELF"),
        ({"RALLYPOINT_TOKEN": "a", "RALLYPOINT_TOKEN_FILE": "/etc/hostname"}, "keep one"),
        ({"RALLYPOINT_PORT_RANGE": "1-99999"}, "RALLYPOINT_PORT_RANGE"),
    ],
)
def test_bad_variables_get_clicks_message(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    ran: list[Settings],
    environ: dict[str, str],
    needle: str,
) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    assert _main(monkeypatch, ["serve"]) == 2
    fast = capsys.readouterr().err
    assert _click_main(monkeypatch, ["serve"]) == 2
    assert fast == capsys.readouterr().err
    assert fast.startswith("error: ") and needle in fast
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
def test_a_failing_sidecar_is_reported_as_click_reports_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failure: BaseException,
    code: int,
    last_line: str,
    verbose: bool,
) -> None:
    def fail(built: Settings, environ: dict[str, str]) -> None:
        raise failure

    monkeypatch.setattr(fastserve, "run", fail)
    argv = ["serve", *BENCH_ARGS, *(["--verbose"] if verbose else [])]
    assert _main(monkeypatch, argv) == code
    fast = capsys.readouterr().err
    assert _click_main(monkeypatch, argv) == code
    slow = capsys.readouterr().err
    assert fast.splitlines()[-1].startswith(last_line)
    assert fast.splitlines()[-1] == slow.splitlines()[-1]
    traced = verbose and not isinstance(failure, KeyboardInterrupt)
    assert ("Traceback (most recent call last)" in fast) is traced
    assert ("Traceback (most recent call last)" in slow) is traced
    if not traced:
        assert fast == slow


# --- what `serve` imports before the sidecar starts ---------------------------------------

_PROBE = """
import json, sys
from rallypoint.cli import fastserve
def run(settings, environ):
    import rallypoint.sidecar  # what serve imports before its listeners bind
    print(json.dumps({"ran": True, "modules": sorted(sys.modules)}))
fastserve.run = run
sys.argv = ["rallypoint", *json.loads(sys.argv[1])]
from rallypoint.cli import main
try:
    main()
finally:
    print(json.dumps({"ran": False, "modules": sorted(sys.modules)}))
"""
NOT_FOR_SERVE = ("rallypoint.client", "rallypoint.cli.commands", "rallypoint.cli.options",
                 "rallypoint.cli.output", "rallypoint.cli.setup", "rallypoint.cli.status",
                 "rallypoint.cli.waiting", "rallypoint.cli.run")  # fmt: skip


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


def _click_modules(modules: list[str]) -> list[str]:
    return [name for name in modules if name == "click" or name.startswith("click.")]


def test_serve_imports_no_click_and_no_cli_only_module() -> None:
    seen = _imports(["serve", *BENCH_ARGS])
    assert seen["ran"]
    assert "rallypoint.sidecar" in seen["modules"]
    assert _click_modules(seen["modules"]) == []
    assert [name for name in NOT_FOR_SERVE if name in seen["modules"]] == []


def test_the_import_probe_sees_click_when_click_parses() -> None:
    seen = _imports(["serve", "--help"])
    assert not seen["ran"]
    assert "click.core" in _click_modules(seen["modules"])
    assert "rallypoint.cli.commands" in seen["modules"]
