"""The CLI through its entry point (click's runner): settings, errors, exit codes, derive."""

from __future__ import annotations

import json
import logging
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from rallypoint.cli import config as cli_config
from rallypoint.cli import logs, output
from rallypoint.cli import setup as cli_setup
from rallypoint.cli.commands import app
from rallypoint.errors import (
    ClusterSpecError,
    ConfigError,
    NotReady,
    OverrideError,
    PortError,
    RendezvousTimeout,
    SidecarUnreachable,
    TFConfigError,
)
from rallypoint.settings import Settings
from tests.support.cli import run
from tests.support.env import clean_env

# --- derive for each provider, each format ------------------------------------------------

PROVIDER_ENVS = {
    "explicit": (
        {"RALLYPOINT_HOSTS": "n0,n1,n2", "RALLYPOINT_NODE_RANK": "2"},
        {"MASTER_ADDR": "n0", "NNODES": "3", "NODE_RANK": "2"},
    ),
    "backendai": (
        {
            "BACKENDAI_CLUSTER_HOSTS": "sub1,main1,sub2",
            "BACKENDAI_CLUSTER_HOST": "sub1",
            "BACKENDAI_CLUSTER_SIZE": "3",
            "BACKENDAI_CLUSTER_ROLE": "sub",
            "BACKENDAI_CLUSTER_IDX": "1",
            "BACKENDAI_SESSION_ID": "sess-1",
        },
        {"MASTER_ADDR": "main1", "NNODES": "3", "NODE_RANK": "1"},
    ),
    "slurm": (
        {
            "SLURM_JOB_NODELIST": "gpu[01-03],login1",
            "SLURM_NODEID": "3",
            "SLURM_NNODES": "4",
            "SLURM_JOB_ID": "77",
        },
        {"MASTER_ADDR": "gpu01", "NNODES": "4", "NODE_RANK": "3"},
    ),
    "single": ({}, {"MASTER_ADDR": "127.0.0.1", "NNODES": "1", "NODE_RANK": "0"}),
}


def _derive_json(environ: Mapping[str, str], *args: str) -> dict[str, str]:
    result = run(["derive", "--format", "json", *args], environ)
    assert result.exit_code == 0, result.stderr
    values = json.loads(result.stdout)
    assert isinstance(values, dict)
    return values


@pytest.mark.parametrize("provider", sorted(PROVIDER_ENVS))
def test_derive_json_serves_the_providers_cluster(provider: str) -> None:
    environ, expected = PROVIDER_ENVS[provider]
    values = _derive_json(environ)
    assert {key: values[key] for key in expected} == expected
    assert values["WORLD_SIZE"] == expected["NNODES"]
    assert values["RANK"] == expected["NODE_RANK"]
    tf_config = json.loads(values["TF_CONFIG"])
    assert tf_config["task"] == {"type": "worker", "index": int(expected["NODE_RANK"])}


@pytest.mark.parametrize("provider", sorted(PROVIDER_ENVS))
def test_derive_notes_that_ports_are_not_reserved(provider: str) -> None:
    result = run(["derive"], PROVIDER_ENVS[provider][0])
    assert result.exit_code == 0
    assert "not reserved" in result.stderr
    assert "not reserved" not in result.stdout


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("provider", sorted(PROVIDER_ENVS))
def test_derive_sh_evaluated_by_bash_reproduces_the_values(provider: str) -> None:
    environ = PROVIDER_ENVS[provider][0]
    values = _derive_json(environ)
    result = run(["derive", "--format", "sh"], environ)
    assert result.exit_code == 0, result.stderr
    script = result.stdout + 'for k in "$@"; do printf "%s=%s\\0" "$k" "${!k}"; done'
    out = subprocess.run(
        ["bash", "-c", script, "bash", *values], env={}, capture_output=True, check=True
    ).stdout.decode()
    evaluated = dict(item.split("=", 1) for item in out.split("\0") if item)
    assert evaluated == values


@pytest.mark.parametrize("provider", sorted(PROVIDER_ENVS))
def test_derive_dotenv_lists_the_same_keys(provider: str) -> None:
    environ = PROVIDER_ENVS[provider][0]
    values = _derive_json(environ)
    result = run(["derive", "--format", "dotenv"], environ)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == list(values)
    assert f"NODE_RANK={values['NODE_RANK']}" in lines


def test_derive_lists_overrides_on_stderr_and_serves_them() -> None:
    result = run(["derive", "--set", "MASTER_PORT=29611"], {"MASTER_ADDR": "10.0.0.9"})
    assert result.exit_code == 0, result.stderr
    values = json.loads(result.stdout)
    assert (values["MASTER_ADDR"], values["MASTER_PORT"]) == ("10.0.0.9", "29611")
    assert "note: MASTER_PORT comes from --set" in result.stderr
    assert "note: MASTER_ADDR comes from environment" in result.stderr


# --- precedence: flag > RALLYPOINT_* > default -------------------------------------------


@pytest.mark.parametrize(
    ("args", "env", "port"),
    [
        ([], {}, "29500"),
        ([], {"RALLYPOINT_MASTER_PORT": "29601"}, "29601"),
        (["--master-port", "29602"], {"RALLYPOINT_MASTER_PORT": "29601"}, "29602"),
        (["--master-port", "29602"], {}, "29602"),
    ],
)
def test_master_port_precedence_flag_env_default(
    args: list[str], env: dict[str, str], port: str
) -> None:
    assert _derive_json(env, *args)["MASTER_PORT"] == port


@pytest.mark.parametrize(
    ("flag", "envvar", "field", "flag_value", "env_value", "expected_flag", "expected_env"),
    [
        ("--deadline", "RALLYPOINT_DEADLINE", "deadline_s", "7", "9", 7.0, 9.0),
        ("--local-port", "RALLYPOINT_LOCAL_PORT", "local_port", "7790", "7791", 7790, 7791),
        ("--port-range", "RALLYPOINT_PORT_RANGE", "port_range", "100-200", "300-400",
         (100, 200), (300, 400)),
        ("--resolve-scope", "RALLYPOINT_RESOLVE_SCOPE", "resolve_scope", "all", "master",
         "all", "master"),
        ("--local-host", "RALLYPOINT_LOCAL_HOSTS", "local_hosts", "::1", "127.0.0.1,::1",
         ("::1",), ("127.0.0.1", "::1")),
        ("--frameworks", "RALLYPOINT_FRAMEWORKS", "frameworks", "tf", "torch",
         frozenset({"tf"}), frozenset({"torch"})),
    ],
)  # fmt: skip
def test_settings_precedence(
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    envvar: str,
    field: str,
    flag_value: str,
    env_value: str,
    expected_flag: object,
    expected_env: object,
) -> None:
    command = app.commands["serve"]
    default = getattr(Settings(), field)
    monkeypatch.delenv(envvar, raising=False)
    assert getattr(_settings(command, []), field) == default
    monkeypatch.setenv(envvar, env_value)
    assert getattr(_settings(command, []), field) == expected_env
    assert getattr(_settings(command, [flag, flag_value]), field) == expected_flag


def _settings(command: click.Command, args: list[str]) -> Settings:
    with command.make_context("serve", args) as ctx:
        return cli_config.build(ctx.params, cli_setup.from_env(ctx), {})


def test_boolean_flags_follow_the_same_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    command = app.commands["serve"]
    monkeypatch.delenv("RALLYPOINT_MDNS", raising=False)
    assert _settings(command, []).mdns is True
    monkeypatch.setenv("RALLYPOINT_MDNS", "false")
    assert _settings(command, []).mdns is False
    assert _settings(command, ["--mdns"]).mdns is True


def test_set_variable_takes_one_assignment_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RALLYPOINT_SET", 'TF_CONFIG={"a b": 1}\n\nMASTER_PORT=1234\n')
    settings = _settings(app.commands["serve"], [])
    assert settings.sets == (("TF_CONFIG", '{"a b": 1}'), ("MASTER_PORT", "1234"))


# --- the token -----------------------------------------------------------------------------


def test_token_from_variable_and_from_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("from-file\n")
    command = app.commands["serve"]
    with command.make_context("serve", []) as ctx:
        settings = cli_config.build(
            ctx.params, cli_setup.from_env(ctx), {"RALLYPOINT_TOKEN": "direct"}
        )
        assert settings.token == "direct"
    with command.make_context("serve", ["--token-file", str(secret_file)]) as ctx:
        settings = cli_config.build(
            ctx.params, cli_setup.from_env(ctx), {"RALLYPOINT_TOKEN": "direct"}
        )
    assert settings.token == "from-file"
    assert "from-file" not in repr(settings)


def test_both_token_variables_is_a_configuration_error(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("s3cret")
    result = run(
        ["derive"], {"RALLYPOINT_TOKEN": "other", "RALLYPOINT_TOKEN_FILE": str(secret_file)}
    )
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: both RALLYPOINT_TOKEN and RALLYPOINT_TOKEN_FILE are set: keep one"
    )


def test_token_never_reaches_the_output(tmp_path: Path) -> None:
    secret_file = tmp_path / "token"
    secret_file.write_text("hunter2-secret\n")
    result = run(["derive", "--verbose", "--token-file", str(secret_file)])
    assert result.exit_code == 0
    assert "hunter2-secret" not in result.stderr + result.stdout


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_configured_logging_redacts_the_token(
    capsys: pytest.CaptureFixture[str], log_format: str
) -> None:
    logs.configure_logging(log_format, verbose=True, secret="hunter2-secret")
    logging.getLogger("rallypoint.test").info("auth.token %s", "hunter2-secret")
    err = capsys.readouterr().err
    assert "auth.token" in err
    assert "[redacted]" in err
    assert "hunter2-secret" not in err


def test_log_formatter_redacts_the_secret_and_keeps_fields() -> None:
    record = logging.makeLogRecord(
        {"name": "rallypoint.x", "levelname": "INFO", "msg": "join.accepted", "args": None}
    )
    record.__dict__.update(rank=2, note="key=hunter2")
    doc = json.loads(logs.JsonFormatter("hunter2").format(record))
    assert doc["event"] == "join.accepted"
    assert doc["rank"] == 2
    assert doc["note"] == "key=[redacted]"
    text = logs.TextFormatter("hunter2").format(record)
    assert "rank=2" in text
    assert "hunter2" not in text


# --- bad input: exit 2, one line, no traceback unless --verbose ---------------------------

BAD_INPUTS = [
    (["--local-port", "70000"], {}, "--local-port"),
    (["--local-port", "http"], {}, "--local-port"),
    ([], {"RALLYPOINT_LOCAL_PORT": "0"}, "RALLYPOINT_LOCAL_PORT"),
    (["--peer-port", "-1"], {}, "--peer-port"),
    ([], {"RALLYPOINT_MASTER_PORT": "65536"}, "RALLYPOINT_MASTER_PORT"),
    (["--port-range", "30000"], {}, "--port-range"),
    (["--port-range", "5-2"], {}, "--port-range"),
    ([], {"RALLYPOINT_PORT_RANGE": "1-99999"}, "RALLYPOINT_PORT_RANGE"),
    (["--resolve-scope", "some"], {}, "--resolve-scope"),
    ([], {"RALLYPOINT_RESOLVE_SCOPE": "everything"}, "RALLYPOINT_RESOLVE_SCOPE"),
    (["--master-addr", "10.0.0.1"], {}, "--master-addr"),
    (["--set", "MASTER_PORT"], {}, "--set"),
    (["--set", "=1"], {}, "--set"),
    ([], {"RALLYPOINT_SET": "NOEQUALS"}, "RALLYPOINT_SET"),
    (["--set", "NOT_SERVED=1"], {}, "--set"),
    (["--token-file", "/nonexistent/token"], {}, "--token-file"),
    ([], {"RALLYPOINT_TOKEN_FILE": "/nonexistent/token"}, "RALLYPOINT_TOKEN_FILE"),
    (["--deadline", "0"], {}, "--deadline"),
    (["--deadline", "inf"], {}, "--deadline"),
    ([], {"RALLYPOINT_BACKOFF_MAX": "soon"}, "RALLYPOINT_BACKOFF_MAX"),
    (["--backoff-initial", "3", "--backoff-max", "1"], {}, "--backoff-initial"),
    (["--nproc-per-node", "0"], {}, "--nproc-per-node"),
    (["--frameworks", "torch,mxnet"], {}, "--frameworks"),
    ([], {"RALLYPOINT_FRAMEWORKS": ","}, "RALLYPOINT_FRAMEWORKS"),
    (["--tf-layout", "ps:0"], {}, "--tf-layout"),
    (["--provider", "yarn"], {}, "--provider"),
    ([], {"RALLYPOINT_STRICT_SELF": "maybe"}, "RALLYPOINT_STRICT_SELF"),
    (["--log-format", "xml"], {}, "--log-format"),
    (["--local-port", "7780", "--peer-port", "7780"], {}, "--peer-port"),
    (["--no-such-flag"], {}, "--no-such-flag"),
    ([], {"RALLYPOINT_HOSTS": "a,b", "RALLYPOINT_NODE_RANK": "5"}, "RALLYPOINT_NODE_RANK"),
    ([], {"RALLYPOINT_HOSTS": "a,b,a"}, "RALLYPOINT_HOSTS"),
    ([], {"RALLYPOINT_DISCOVERY": "mdns", "RALLYPOINT_NNODES": "2"}, "mdns"),
    ([], {"MASTER_PORT": "http"}, "MASTER_PORT"),
    ([], {"TF_CONFIG": '{"cluster": {}, "task": {"type": "worker", "index": -1}}'}, "TF_CONFIG"),
    ([], {"RALLYPOINT_FRAMEWORKS": "torch,caffe"}, "'caffe'"),
    (["--frameworks", "jax"], {"JAX_COORDINATOR_ADDRESS": "main1"}, "'main1' is not host:port"),
    (["--frameworks", "jax", "--set", "JAX_COORDINATOR_ADDRESS=fd00::1:80"], {}, "[fd00::1]:80"),
    (["--jax-port", "0"], {}, "--jax-port"),
    (["--min-link-mbps", "0"], {}, "--min-link-mbps"),
    ([], {"RALLYPOINT_MIN_LINK_MBPS": "nan"}, "RALLYPOINT_MIN_LINK_MBPS"),
    ([], {"RALLYPOINT_THROUGHPUT": "sometimes"}, "RALLYPOINT_THROUGHPUT"),
]


def _assert_one_error_line(result: Result, needle: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(("args", "env", "needle"), BAD_INPUTS)
def test_bad_input_exits_2_with_one_line(args: list[str], env: dict[str, str], needle: str) -> None:
    _assert_one_error_line(run(["derive", *args], env), needle)


@pytest.mark.parametrize(
    "args",
    [
        ["wait", "--timeout", "-5"],
        ["wait", "--format", "yaml"],
        ["check", "--timeout", "0"],
        ["exec"],
        ["demo", "--nodes", "0"],
        ["peers", "--seconds", "x"],
        ["nosuchcommand"],
        ["wait", "--bogus"],
        ["wait", "--quite"],
        ["status", "--explain=1"],
    ],
)
def test_usage_errors_of_other_commands_exit_2(args: list[str]) -> None:
    result = run(args)
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("error: ")
    # One remedy: the value's, click's suggestion or a pointer to --help, never two.
    assert ("Did you mean" in result.stderr) + ("--help`" in result.stderr) <= 1


def test_verbose_adds_the_traceback_for_errors_raised_by_the_command() -> None:
    quiet = run(["derive", "--set", "NOT_SERVED=1"])
    loud = run(["derive", "--verbose", "--set", "NOT_SERVED=1"])
    assert loud.exit_code == quiet.exit_code == 2
    assert "Traceback" not in quiet.stderr
    assert "Traceback (most recent call last)" in loud.stderr
    assert "OverrideError" in loud.stderr
    assert loud.stderr.splitlines()[-1] == quiet.stderr.strip()


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("x"), 2),
        (ClusterSpecError("x"), 2),
        (TFConfigError("x"), 2),
        (OverrideError("x"), 2),
        (RendezvousTimeout("x"), 3),
        (NotReady("x"), 1),
        (SidecarUnreachable("x"), 1),
        (PortError("x"), 1),
        (RuntimeError("x"), 1),
    ],
)
def test_exit_codes(exc: Exception, code: int) -> None:
    assert output.exit_code(exc) == code


# --- help, environment ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(app.commands))
def test_every_option_has_a_rallypoint_variable_shown_in_help(name: str) -> None:
    command = app.commands[name]
    options = [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]
    assert options
    result = run([name, "--help"])
    assert result.exit_code == 0
    help_text = " ".join(result.stdout.split())
    for option in options:
        assert isinstance(option.envvar, str), option.name
        assert option.envvar.startswith("RALLYPOINT_"), option.name
        assert option.show_envvar
        # click may wrap a long name at a hyphen; compare without whitespace.
        assert option.envvar in help_text.replace("- ", "-").replace(" ", ""), option.envvar


def test_process_environ_adds_hostname_only_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOSTNAME", raising=False)
    monkeypatch.setattr(socket, "gethostname", lambda: "node-from-kernel")
    assert cli_config.process_environ()["HOSTNAME"] == "node-from-kernel"
    monkeypatch.setenv("HOSTNAME", "node-from-shell")
    assert cli_config.process_environ()["HOSTNAME"] == "node-from-shell"


def test_derive_uses_hostname_from_the_kernel_when_unexported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "n1")
    env = {"RALLYPOINT_HOSTS": "n0,n1,n2"}
    result = CliRunner().invoke(app, ["derive"], env={**clean_env(env), "HOSTNAME": None})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["NODE_RANK"] == "1"


@pytest.mark.parametrize(("verbose", "traceback_shown"), [(False, False), (True, True)])
def test_logged_exceptions_carry_a_traceback_only_when_verbose(
    capsys: pytest.CaptureFixture[str], verbose: bool, traceback_shown: bool
) -> None:
    logs.configure_logging("text", verbose=verbose)
    try:
        raise OSError(101, "Network is unreachable")
    except OSError:
        logging.getLogger("rallypoint.test").warning("send_failed", exc_info=True)
    err = capsys.readouterr().err
    assert "send_failed" in err
    assert "Network is unreachable" in err
    assert ("Traceback" in err) is traceback_shown
