"""Rendering: json, sh that eval reproduces exactly, dotenv that both compose readers read back."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.served.render import FORMATS, dotenv_quote, render
from tests.conftest import require

SAMPLE = {
    "MASTER_ADDR": "main1",
    "MASTER_PORT": "29500",
    "TF_CONFIG": '{"cluster":{"worker":["[fd00::1]:2222"]},"task":{"type":"worker","index":0}}',
    "EMPTY": "",
}
# A fixed prefix keeps generated names clear of bash's own variables (_, IFS, PWD, ...).
NAMES = st.from_regex(r"RP_[A-Z0-9_]{0,8}", fullmatch=True)
# Environment values are text: any character an encoder can write, except NUL.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=40)
ENVS = st.dictionaries(NAMES, TEXT, min_size=1, max_size=5)


def test_formats() -> None:
    assert FORMATS == ("json", "sh", "dotenv")


@pytest.mark.parametrize("fmt", ["yaml", "", "JSON", "env"])
def test_unknown_format_is_value_error(fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown format"):
        render(SAMPLE, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    ("values", "match"), [({"A-B": "1"}, "variable name"), ({"A": "x\0"}, "NUL")]
)
def test_unrepresentable_input_is_value_error(fmt: str, values: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        render(values, fmt)


def test_json_is_an_object_in_order_with_trailing_newline() -> None:
    text = render(SAMPLE, "json")
    assert text.endswith("}\n")
    assert json.loads(text) == SAMPLE
    assert list(json.loads(text)) == list(SAMPLE)


@pytest.mark.parametrize(
    ("value", "line"),
    [
        ("29500", "export K=29500\n"),
        ("", "export K=''\n"),
        ("a b", "export K='a b'\n"),
        ("it's", "export K='it'\"'\"'s'\n"),
        ('{"a":1}', "export K='{\"a\":1}'\n"),
    ],
)
def test_sh_lines(value: str, line: str) -> None:
    assert render({"K": value}, "sh") == line


def _bash_eval(script: str, keys: list[str]) -> list[str]:
    """Run eval of script in bash and return each key's value, NUL-separated to keep newlines."""
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".sh", delete=False) as file:
        file.write(script)
    try:
        program = 'eval "$(cat "$1")"; shift; for k in "$@"; do printf "%s\\0" "${!k}"; done'
        out = subprocess.run(
            ["bash", "-c", program, "bash", file.name, *keys],
            capture_output=True,
            check=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
        ).stdout
    finally:
        os.unlink(file.name)
    return out.decode("utf-8").split("\0")[:-1]


def test_sh_round_trips_tf_config_through_bash() -> None:
    assert _bash_eval(render(SAMPLE, "sh"), list(SAMPLE)) == list(SAMPLE.values())


@settings(max_examples=100, deadline=None)
@given(ENVS)
def test_sh_eval_reproduces_arbitrary_values(values: dict[str, str]) -> None:
    assert _bash_eval(render(values, "sh"), list(values)) == list(values.values())


# --- dotenv --------------------------------------------------------------------------------
#
# Two readers matter: compose v2 reads env_file with compose-go's dotenv parser,
# compose 1.29 with python-dotenv (then keeps `$` literal). compose_go_read below
# models compose-go's dotenv/parser.go (quoted values: the terminator is a quote not
# preceded by a backslash; single quotes verbatim; double quotes unescape
# \a \b \f \n \r \t \v \\ \" \$ and interpolate; unquoted values end at " #", are
# right-trimmed and interpolated). Interpolation is not modelled: any `$` it would
# see is reported, since rallypoint must never write one there.

_ESCAPES = re.compile(r"\\(?:[abcfnrtv$\"\\]|0[0-7]{0,3})")
_GO_CHARS = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


class Interpolated(Exception):
    """The model parser met a `$` that compose-go would interpolate."""


def _go_unescape(match: re.Match[str]) -> str:
    seq = match.group(0)[1:]
    if seq == "$":
        return "$"
    if seq[0] == "0":
        return chr(int(seq[1:] or "0", 8))
    return _GO_CHARS.get(seq, seq)


def compose_go_read(text: str) -> dict[str, str]:
    """Read an env file the way compose v2 (compose-go dotenv) does, minus interpolation."""
    out: dict[str, str] = {}
    rest = text
    while True:
        rest = rest.lstrip()
        if not rest:
            return out
        if rest[0] == "#":
            rest = rest.partition("\n")[2]
            continue
        key, sep, rest = rest.partition("=")
        assert sep and "\n" not in key, f"bad line near {key!r}"
        key = key.strip()
        rest = rest.lstrip(" \t")
        if rest[:1] in ("'", '"'):
            quote = rest[0]
            end = next(
                (i for i in range(1, len(rest)) if rest[i] == quote and rest[i - 1] != "\\"), None
            )
            assert end is not None, f"unterminated quoted value for {key}"
            value = rest[1:end]
            rest = rest[end + 1 :]
            if quote == '"':
                if re.search(r"(?<!\\)\$", value):
                    raise Interpolated(key)
                value = _ESCAPES.sub(_go_unescape, value)
        else:
            line, _, rest = rest.partition("\n")
            value = line.split(" #")[0].rstrip()
            if "$" in value:
                raise Interpolated(key)
        out[key] = value


def compose_1_29_read(text: str) -> dict[str, str]:
    """Read an env file the way compose 1.29 does: python-dotenv on a file, then as is."""
    import dotenv

    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".env", delete=False) as file:
        file.write(text)
    try:
        values = dotenv.dotenv_values(dotenv_path=file.name, encoding="utf-8-sig", interpolate=True)
    finally:
        os.unlink(file.name)
    return {key: value or "" for key, value in values.items()}


def _need_python_dotenv() -> None:
    require(
        importlib.util.find_spec("dotenv") is not None,
        "python-dotenv (compose 1.29's env_file reader) is not installed",
    )


# Known compose-go behaviour, from compose-go's own dotenv tests.
COMPOSE_GO_KNOWN = [
    ('FOO="bar\\nbaz"', "bar\nbaz"),
    ("FOO='bar#baz' # comment", "bar#baz"),
    ("FOO=bar # this is foo", "bar"),
    ("FOO=bar ", "bar"),
    ("FOO=foobar=", "foobar="),
    ('FOO="escaped\\"bar"', 'escaped"bar'),
    ("FOO=\"'d'\"", "'d'"),
    ("FOO='ba#r'", "ba#r"),
    ("FOO='quote $BAR'", "quote $BAR"),
    ("FOO='back\\slash'", "back\\slash"),
]


@pytest.mark.parametrize(("line", "value"), COMPOSE_GO_KNOWN)
def test_compose_go_model_matches_known_behaviour(line: str, value: str) -> None:
    assert compose_go_read(line + "\n") == {"FOO": value}


# Known compose 1.29 behaviour, measured with docker-compose 1.29.2 `config` on an env_file.
COMPOSE_1_29_KNOWN = [
    ("A=plain", "plain"),
    ("A='it\\'s \\\\ back'", "it's \\ back"),
    ('A="tab\tx \\t \\\\ \\" q"', 'tab\tx \t \\ " q'),
    ("A='multi\nline'", "multi\nline"),
    ('A="a$$b"', "a$$b"),
    ("A='keep $NAME'", "keep $NAME"),
]


@pytest.mark.parametrize(("line", "value"), COMPOSE_1_29_KNOWN)
def test_compose_1_29_reader_matches_known_behaviour(line: str, value: str) -> None:
    _need_python_dotenv()
    assert compose_1_29_read(line + "\n") == {"A": value}


def test_compose_1_29_interpolates_braces_even_in_single_quotes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Why render refuses "${": python-dotenv expands it in every quoting style.
    _need_python_dotenv()
    monkeypatch.setenv("RALLYPOINT_TEST_PROBE", "probe")
    assert compose_1_29_read("A='${RALLYPOINT_TEST_PROBE}'\n") == {"A": "probe"}


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("29500", "29500"),
        ("main-1.example:80/x,y@z%+=", "main-1.example:80/x,y@z%+="),
        ("", "''"),
        ("a b #c", "'a b #c'"),
        ('{"a":[1]}', "'{\"a\":[1]}'"),
        ("line1\nline2", "'line1\nline2'"),
        ("$HOME", "'$HOME'"),
        ("it's", '"it\'s"'),
        ('back\\slash "q"', '"back\\\\slash \\"q\\""'),
        ("cr\rlf\n", '"cr\\rlf\\n"'),
    ],
)
def test_dotenv_quoting_rule(value: str, written: str) -> None:
    assert dotenv_quote("K", value) == written


@pytest.mark.parametrize("value", ["it's $5", "a\\$b", "${HOME}", "trailing\\", "cr\r$"])
def test_dotenv_refuses_values_the_readers_disagree_on(value: str) -> None:
    with pytest.raises(ValueError, match="K cannot be written as dotenv"):
        render({"K": value}, "dotenv")


def _dotenv_expressible(value: str) -> bool:
    if "$" in value and any(bad in value for bad in ("'", "\\", "\r")):
        return False
    return "${" not in value and not value.endswith("\\")


def _check_dotenv(values: Mapping[str, str]) -> None:
    try:
        text = render(values, "dotenv")
    except ValueError:
        assert not all(_dotenv_expressible(value) for value in values.values())
        return
    assert all(_dotenv_expressible(value) for value in values.values())
    assert compose_go_read(text) == dict(values)
    assert compose_1_29_read(text) == dict(values)


def test_dotenv_round_trips_the_sample() -> None:
    _need_python_dotenv()
    _check_dotenv(SAMPLE)


@settings(max_examples=200, deadline=None)
@given(ENVS)
def test_dotenv_round_trips_arbitrary_values_in_both_readers(values: dict[str, str]) -> None:
    _need_python_dotenv()
    _check_dotenv(values)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(NAMES, st.text(st.sampled_from("ab $'\"\\\n\r\t#{}="), max_size=12)))
def test_dotenv_round_trips_quote_heavy_values(values: dict[str, str]) -> None:
    _need_python_dotenv()
    _check_dotenv(values)
