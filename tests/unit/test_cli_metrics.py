"""The metrics listener's options: --metrics-port and --metrics-host, flag and variable."""

from __future__ import annotations

import pytest

from rallypoint.cli import config as cli_config
from tests.support.cli import run

BAD = [
    (["--metrics-port", "0"], {}, "--metrics-port"),
    (["--metrics-port", "65536"], {}, "--metrics-port"),
    (["--metrics-port", "metrics"], {}, "--metrics-port"),
    ([], {"RALLYPOINT_METRICS_PORT": "-1"}, "RALLYPOINT_METRICS_PORT"),
    (["--metrics-port", "7781"], {}, "--metrics-port 7781 is also --peer-port"),
    (["--metrics-port", "9000", "--local-port", "9000"], {}, "--metrics-port 9000 is also"),
    ([], {"RALLYPOINT_METRICS_PORT": "7780"}, "RALLYPOINT_METRICS_PORT 7780 is also"),
    (["--metrics-port", "9100", "--metrics-host", "node-1"], {}, "--metrics-host"),
    (["--metrics-port", "9100", "--metrics-host", "10.0.0.300"], {}, "--metrics-host"),
    (["--metrics-port", "9100", "--metrics-host", "fe80::1%eth0"], {}, "--metrics-host"),
    (["--metrics-port", "9100"], {"RALLYPOINT_METRICS_HOST": "any"}, "RALLYPOINT_METRICS_HOST"),
    (["--metrics-host", "10.0.0.5"], {}, "--metrics-host is set but the metrics listener is off"),
    ([], {"RALLYPOINT_METRICS_HOST": "::"}, "RALLYPOINT_METRICS_HOST is set"),
]


@pytest.mark.parametrize(("args", "env", "needle"), BAD)
def test_a_bad_metrics_option_exits_2_with_one_line_naming_it(
    args: list[str], env: dict[str, str], needle: str
) -> None:
    result = run(["derive", *args], env)
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert needle in lines[0]
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("params", "env", "port", "host"),
    [
        ({}, {}, None, "0.0.0.0"),
        ({"metrics_port": "9100"}, {}, 9100, "0.0.0.0"),
        ({"metrics_port": "9100", "metrics_host": " fd00::0005 "}, {}, 9100, "fd00::5"),
        ({"metrics_port": "9100", "metrics_host": "10.1.2.3"}, {}, 9100, "10.1.2.3"),
    ],
)
def test_metrics_settings_from_options(
    params: dict[str, str], env: dict[str, str], port: int | None, host: str
) -> None:
    from rallypoint.cli.rules import Address
    from rallypoint.cli.specs import SETTINGS

    specs = {spec.name: spec for spec in SETTINGS}
    values = {name: specs[name].rule(value) for name, value in params.items()}  # type: ignore[misc]
    built = cli_config.build(values, {}, {})
    assert (built.metrics_port, built.metrics_host) == (port, host)
    assert isinstance(specs["metrics_host"].rule, Address)


def test_help_shows_both_options_with_their_variables() -> None:
    shown = run(["serve", "--help"])
    assert shown.exit_code == 0
    text = " ".join(shown.stdout.split())
    for needle in ("--metrics-port", "RALLYPOINT_METRICS_PORT", "--metrics-host",
                   "RALLYPOINT_METRICS_HOST", "default: (off)"):  # fmt: skip
        assert needle in text, needle
