"""The hostfile: `host slots=N` in rank order, read back by DeepSpeed's own parser."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.errors import ConfigError, HostfileError
from rallypoint.served import hostfile
from tests.conftest import require


@pytest.mark.parametrize(
    ("hosts", "slots", "expected"),
    [
        (("main1", "sub1", "sub2"), 1, "main1 slots=1\nsub1 slots=1\nsub2 slots=1\n"),
        (("gpu01.cluster.local",), 8, "gpu01.cluster.local slots=8\n"),
        (("fd00::10", "10.0.0.2"), 2, "fd00::10 slots=2\n10.0.0.2 slots=2\n"),
    ],
)
def test_render(hosts: tuple[str, ...], slots: int, expected: str) -> None:
    assert hostfile.render(hosts, slots) == expected


@pytest.mark.parametrize(
    ("values", "default", "expected"),
    [
        ({"PET_NPROC_PER_NODE": "4"}, 1, 4),
        ({}, 3, 3),  # torch not served: the --nproc-per-node setting
        ({"PET_NPROC_PER_NODE": "1"}, 8, 1),  # a user value wins
    ],
)
def test_slots(values: dict[str, str], default: int, expected: int) -> None:
    assert hostfile.slots(values, default) == expected


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: hostfile.slots({"PET_NPROC_PER_NODE": "gpu"}, 1), "PET_NPROC_PER_NODE='gpu'"),
        (lambda: hostfile.render(("a",), 0), "at least 1"),
        (lambda: hostfile.render((), 1), "no hosts"),
        (lambda: hostfile.render(("a b",), 1), "'a b'"),
    ],
)
def test_errors_name_the_value(call: Callable[[], Any], match: str) -> None:
    with pytest.raises(HostfileError, match=match):
        call()
    assert issubclass(HostfileError, ConfigError)  # exit code 2


def deepspeed_parser() -> Callable[[Sequence[str]], Any]:
    require(
        importlib.util.find_spec("deepspeed") is not None,
        "DeepSpeed is not installed (pip install deepspeed)",
    )
    from deepspeed.launcher.runner import _parse_hostfile  # type: ignore[import-untyped]

    parse: Callable[[Sequence[str]], Any] = _parse_hostfile
    return parse


_LABEL = st.from_regex(r"[a-z0-9](?:[a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_HOST = st.one_of(
    st.lists(_LABEL, min_size=1, max_size=3).map(".".join).filter(lambda h: not h.isdigit()),
    st.ip_addresses().map(str),
)


@pytest.mark.deepspeed
@settings(max_examples=200, deadline=None)
@given(hosts=st.lists(_HOST, min_size=1, max_size=16, unique=True), slots=st.integers(1, 512))
def test_deepspeed_reads_every_host_in_rank_order(hosts: list[str], slots: int) -> None:
    parse = deepspeed_parser()
    text = hostfile.render(hosts, slots)
    pool = parse(text.splitlines(keepends=True))
    assert list(pool.items()) == [(host, slots) for host in hosts]
