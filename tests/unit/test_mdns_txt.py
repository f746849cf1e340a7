"""The announcement codec: TXT encoding and validation, instance names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.core import names
from rallypoint.errors import PeerMessageError
from rallypoint.mdns import txt

GOOD = {
    b"v": b"1",
    b"session": b"job-42",
    b"host": b"node-a",
    b"rank": b"-1",
    b"port": b"7781",
    b"gen": b"g1",
    b"addrs": b"10.0.0.1,fd00::1",
}


def test_encode_parse_round_trip() -> None:
    fields, own = txt.encode_fields(
        session="job-42", host="node-a.example", rank=3, peer_port=7781, generation="g7",
        addresses=["10.0.0.1", "fd00::1"],
    )  # fmt: skip
    parsed, decoded = txt.parse_fields(
        {k.encode(): v.encode() for k, v in fields.items()}, instance=own.instance
    )
    assert parsed == own
    assert decoded == fields
    assert (parsed.host, parsed.rank, parsed.peer_port, parsed.generation) == (
        "node-a.example",
        3,
        7781,
        "g7",
    )
    assert parsed.addresses == ("10.0.0.1", "fd00::1")


def test_encode_keeps_addresses_that_fit_one_txt_string() -> None:
    addresses = [f"fd00::{i + 1:x}" for i in range(60)]
    fields, own = txt.encode_fields(
        session="s", host="h", rank=0, peer_port=1, generation="", addresses=addresses
    )
    assert len(f"addrs={fields['addrs']}".encode()) <= txt.MAX_VALUE_BYTES
    assert 0 < len(own.addresses) < len(addresses)
    assert list(own.addresses) == addresses[: len(own.addresses)]


def test_encode_refuses_what_peers_would_drop() -> None:
    with pytest.raises(PeerMessageError, match="host"):
        txt.encode_fields(
            session="s", host="bad_host", rank=0, peer_port=1, generation="", addresses=()
        )


@pytest.mark.parametrize(
    ("change", "fault"),
    [
        ({b"v": b"2"}, "v="),
        ({b"session": None}, "no value"),
        ({b"session": b"has space"}, "session"),
        ({b"session": b"x" * 200}, "session"),
        ({b"host": b"under_score"}, "host"),
        ({b"host": b"-lead"}, "host"),
        ({b"rank": b"one"}, "rank"),
        ({b"rank": b"-2"}, "rank"),
        ({b"rank": b" 1"}, "rank"),
        ({b"port": b"0"}, "port"),
        ({b"port": b"65536"}, "port"),
        ({b"port": b"+80"}, "port"),
        ({b"gen": b"g 1"}, "gen"),
        ({b"addrs": b"10.0.0.1,not-an-ip"}, "address"),
        ({b"host": b"\xff\xfe"}, "UTF-8"),
        ({b"huge": b"x" * 256}, "oversized"),
        ({f"k{i}".encode(): b"x" for i in range(20)}, "TXT keys"),
    ],
)
def test_parse_rejects_bad_fields(change: dict[bytes, bytes | None], fault: str) -> None:
    with pytest.raises(PeerMessageError, match=fault):
        txt.parse_fields({**GOOD, **change}, instance="i")


@pytest.mark.parametrize("key", [k for k in GOOD if k != b"addrs"])
def test_parse_rejects_missing_field(key: bytes) -> None:
    props = {k: v for k, v in GOOD.items() if k != key}
    with pytest.raises(PeerMessageError, match="lacks"):
        txt.parse_fields(props, instance="i")


@settings(max_examples=200)
@given(
    st.dictionaries(
        st.sampled_from([*GOOD, b"x", b"\xff"]) | st.binary(max_size=8),
        st.none() | st.sampled_from(list(GOOD.values())) | st.binary(max_size=300),
        max_size=20,
    )
)
def test_parse_never_crashes(props: dict[bytes, bytes | None]) -> None:
    try:
        announcement, _ = txt.parse_fields(props, instance="i")
    except PeerMessageError:
        return
    assert names.host_problem(announcement.host, ip=True) is None
    assert 1 <= announcement.peer_port <= 65535


@pytest.mark.parametrize(
    ("session", "host"),
    [("s", "h"), ("job.42", "node.example.com"), ("x" * 80, "node-1"), ("x" * 80, "node-2")],
)
def test_instance_name_is_one_short_label(session: str, host: str) -> None:
    name = txt.instance_name(session, host)
    assert len(name.encode()) <= txt.MAX_INSTANCE_BYTES
    assert "." not in name
    assert name == txt.instance_name(session, host)


def test_long_instance_names_stay_distinct() -> None:
    names = {txt.instance_name("x" * 80, f"node-{i}") for i in range(50)}
    assert len(names) == 50


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("job-node-a._rallypoint._tcp.local.", "job-node-a"),
        ("job-node-a-2._rallypoint._tcp.local.", "job-node-a-2"),
        # Not one of ours: kept whole rather than cut at a guess.
        ("job-node-a._other._tcp.local.", "job-node-a._other._tcp.local."),
        ("_rallypoint._tcp.local.", "_rallypoint._tcp.local."),
    ],
)
def test_instance_label_strips_only_our_service_type(name: str, label: str) -> None:
    assert txt.instance_label(name) == label
