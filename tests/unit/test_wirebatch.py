"""wire/batch.py: a relay's batches round-trip, and anything else names the item at fault."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint import wire
from rallypoint.core import fanout
from rallypoint.errors import PeerMessageError
from rallypoint.model import Member
from rallypoint.reasons import Reason
from rallypoint.wire import batch as wirebatch

MEMBERS = (
    Member(4, "node4", ("10.0.0.4",), 2222, None, 7000),
    Member(5, "node5.example.com", ("10.0.0.5", "fd00::5"), None),
)
REPORTS = (
    wire.Report("s", "ep.1", 4, "node4", True, net=wire.NetFacts("eth0", 1500)),
    wire.Report(
        "s",
        "ep.1",
        5,
        "node5",
        False,
        failures=(Reason("peer_unreachable", "node5 cannot reach node1", "node1", None, (5, 1)),),
        busy=frozenset({"tf"}),
    ),
)


def test_join_batch_round_trips() -> None:
    batch = wirebatch.JoinBatch("s", 3, MEMBERS)
    assert wirebatch.parse_join_batch(wirebatch.encode_join_batch(batch)) == batch


def test_report_batch_round_trips() -> None:
    batch = wirebatch.ReportBatch("s", "ep.1", 3, REPORTS, seen=7, hold=False)
    assert wirebatch.parse_report_batch(wirebatch.encode_report_batch(batch)) == batch


def _join_batch(**changes: object) -> bytes:
    data = json.loads(wirebatch.encode_join_batch(wirebatch.JoinBatch("s", 3, MEMBERS)))
    data.update(changes)
    return json.dumps(data).encode()


def _report_batch(**changes: object) -> bytes:
    batch = wirebatch.ReportBatch("s", "ep.1", 3, REPORTS)
    data = json.loads(wirebatch.encode_report_batch(batch))
    data.update(changes)
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (_join_batch(members="x"), "Expected `array`, got `str` - at `$.members`"),
        (_join_batch(members=[1]), "Expected `object`, got `int` - at `$.members[0]`"),
        (
            _join_batch(members=[{"rank": 4, "host": "node4", "addresses": ["nope"]}]),
            "members[0]: addresses[0] must be an IP address",
        ),
        (
            _join_batch(members=[{"rank": 4, "host": "a", "addresses": []}] * 1025),
            "length <= 1024 - at `$.members`",
        ),
        (_join_batch(relay=0), "$.relay"),
        (_join_batch(session=""), "$.session"),
        (b"[]", "Expected `object`"),
    ],
)
def test_bad_join_batches_name_the_fault(body: bytes, names: str) -> None:
    with pytest.raises(PeerMessageError) as info:
        wirebatch.parse_join_batch(body)
    assert str(info.value).startswith("join batch: ") and names in str(info.value)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        (_report_batch(reports={}), "Expected `array`, got `object` - at `$.reports`"),
        (_report_batch(generation="other.2"), "another session or generation"),
        (_report_batch(session="t"), "another session or generation"),
        (_report_batch(hold="yes"), "$.hold"),
        (_report_batch(seen=-2), "$.seen"),
        (
            _report_batch(reports=[{"rank": 4}]),
            "missing required field `session` - at `$.reports[0]`",
        ),
    ],
)
def test_bad_report_batches_name_the_fault(body: bytes, names: str) -> None:
    with pytest.raises(PeerMessageError) as info:
        wirebatch.parse_report_batch(body)
    assert str(info.value).startswith("report batch: ") and names in str(info.value)


def test_a_batch_larger_than_the_limit_is_refused() -> None:
    with pytest.raises(PeerMessageError):
        wirebatch.parse_join_batch(b" " * (wirebatch.MAX_BATCH_BYTES + 1))


@given(st.lists(st.integers(1, 20_000), max_size=400))
def test_chunks_keep_order_and_fit_the_limit(sizes: list[int]) -> None:
    chunks = list(wirebatch.chunks(sizes, lambda size: size))
    assert [size for chunk in chunks for size in chunk] == sizes
    for chunk in chunks:
        assert chunk
        assert len(chunk) == 1 or sum(chunk) + len(chunk) <= wirebatch.MAX_BATCH_BYTES - 1024


def test_a_full_group_of_reports_fits_one_batch() -> None:
    """128 passed reports (the largest group) need no second request."""
    reports = [wire.Report("s", "ep.1", r, f"node{r}", True) for r in range(1, 129)]
    assert len(list(wirebatch.chunks(reports, lambda r: len(wire.encode_report(r))))) == 1


def test_a_full_group_of_joins_fits_one_batch() -> None:
    members = [
        Member(r, f"node-{r:05d}.cluster.example.com", ("10.0.0.1", "fd00::1"), 2222, None, 7000)
        for r in range(1, fanout.MAX_GROUP)
    ]
    chunks = list(
        wirebatch.chunks(members, lambda m: len(wire.encode_join(wire.JoinRequest("s", m))))
    )
    assert len(chunks) == 1
    body = wirebatch.encode_join_batch(wirebatch.JoinBatch("s", 128, tuple(chunks[0])))
    assert len(body) < wirebatch.MAX_BATCH_BYTES
