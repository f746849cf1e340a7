"""Slurm hostlist expansion: tables plus properties of generated ranges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.errors import ClusterSpecError
from rallypoint.providers.hostlist import expand


@pytest.mark.parametrize(
    ("expression", "hosts"),
    [
        ("login1", ["login1"]),
        ("a,b,c", ["a", "b", "c"]),
        ("gpu[01-04,07],login1", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"]),
        ("gnode[10,20,25,37]", ["gnode10", "gnode20", "gnode25", "gnode37"]),
        ("n[7]", ["n7"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[001-3]", ["n001", "n002", "n003"]),
        ("n[3-3]", ["n3"]),
        ("rack[1-2]-node[01-02]", ["rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"]),
        ("r[1,3]n[1-2]-ib", ["r1n1-ib", "r1n2-ib", "r3n1-ib", "r3n2-ib"]),
        ("[1-2]x", ["1x", "2x"]),
        ("a[1-2],b[3],c", ["a1", "a2", "b3", "c"]),
        ("node-[1-2].cluster.local", ["node-1.cluster.local", "node-2.cluster.local"]),
    ],
)
def test_expand(expression: str, hosts: list[str]) -> None:
    assert expand(expression) == hosts


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("", "empty entry"),
        ("a,,b", "empty entry"),
        ("a,", "empty entry"),
        ("n[1-2", "'[' without ']'"),
        ("n1-2]", "']' without '['"),
        ("n[[1]]", "nested '['"),
        ("n[]", "bad range ''"),
        ("n[1-]", "bad range '1-'"),
        ("n[-1]", "bad range '-1'"),
        ("n[a-b]", "bad range 'a-b'"),
        ("n[1-2-3]", "bad range '1-2-3'"),
        ("n[1,,2]", "bad range ''"),
        ("n[5-1]", "runs backwards"),
        ("n[1234567890123]", "bad range"),
        ("n[0-99999999999]", "more than 65536 hosts"),
        ("a[0-999]b[0-999]", "more than 65536 hosts"),
        ("x[0-40000],y[0-40000]", "more than 65536 hosts"),
    ],
)
def test_malformed_expressions_name_the_variable(expression: str, fragment: str) -> None:
    with pytest.raises(ClusterSpecError) as info:
        expand(expression, variable="SLURM_JOB_NODELIST")
    message = str(info.value)
    assert message.startswith(f"SLURM_JOB_NODELIST={expression!r}"), message
    assert fragment in message, message


def test_limit_is_configurable() -> None:
    assert len(expand("n[1-10]", limit=10)) == 10
    with pytest.raises(ClusterSpecError, match="more than 9 hosts"):
        expand("n[1-10]", limit=9)


prefixes = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z-]", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(
    prefix=prefixes,
    suffix=st.from_regex(r"(-[a-z]{1,3})?", fullmatch=True),
    lo=st.integers(0, 5000),
    span=st.integers(0, 60),
    width=st.integers(1, 6),
)
def test_generated_ranges_expand_to_their_numbers(
    prefix: str, suffix: str, lo: int, span: int, width: int
) -> None:
    hi = lo + span
    expression = f"{prefix}[{lo:0{width}d}-{hi:0{width}d}]{suffix}"
    expected = [f"{prefix}{n:0{width}d}{suffix}" for n in range(lo, hi + 1)]
    assert expand(expression) == expected
