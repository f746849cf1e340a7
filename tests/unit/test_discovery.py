"""Pure mDNS discovery rules: TXT encoding and validation, instance names, rank assignment."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint import discovery, names
from rallypoint.discovery import Announcement, assign_ranks
from rallypoint.errors import ClusterSpecError, PeerMessageError

GOOD = {
    b"v": b"1",
    b"session": b"job-42",
    b"host": b"node-a",
    b"rank": b"-1",
    b"port": b"7781",
    b"gen": b"g1",
    b"addrs": b"10.0.0.1,fd00::1",
}


def ann(host: str, session: str = "s", instance: str | None = None) -> Announcement:
    return Announcement(session, host, -1, 7781, "", ("10.0.0.1",), instance or f"{session}-{host}")


def test_encode_parse_round_trip() -> None:
    fields, own = discovery.encode_fields(
        session="job-42", host="node-a.example", rank=3, peer_port=7781, generation="g7",
        addresses=["10.0.0.1", "fd00::1"],
    )  # fmt: skip
    parsed, decoded = discovery.parse_fields(
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
    fields, own = discovery.encode_fields(
        session="s", host="h", rank=0, peer_port=1, generation="", addresses=addresses
    )
    assert len(f"addrs={fields['addrs']}".encode()) <= discovery.MAX_VALUE_BYTES
    assert 0 < len(own.addresses) < len(addresses)
    assert list(own.addresses) == addresses[: len(own.addresses)]


def test_encode_refuses_what_peers_would_drop() -> None:
    with pytest.raises(PeerMessageError, match="host"):
        discovery.encode_fields(
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
        discovery.parse_fields({**GOOD, **change}, instance="i")


@pytest.mark.parametrize("key", [k for k in GOOD if k != b"addrs"])
def test_parse_rejects_missing_field(key: bytes) -> None:
    props = {k: v for k, v in GOOD.items() if k != key}
    with pytest.raises(PeerMessageError, match="lacks"):
        discovery.parse_fields(props, instance="i")


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
        announcement, _ = discovery.parse_fields(props, instance="i")
    except PeerMessageError:
        return
    assert names.host_problem(announcement.host, ip=True) is None
    assert 1 <= announcement.peer_port <= 65535


@pytest.mark.parametrize(
    ("session", "host"),
    [("s", "h"), ("job.42", "node.example.com"), ("x" * 80, "node-1"), ("x" * 80, "node-2")],
)
def test_instance_name_is_one_short_label(session: str, host: str) -> None:
    name = discovery.instance_name(session, host)
    assert len(name.encode()) <= discovery.MAX_INSTANCE_BYTES
    assert "." not in name
    assert name == discovery.instance_name(session, host)


def test_long_instance_names_stay_distinct() -> None:
    names = {discovery.instance_name("x" * 80, f"node-{i}") for i in range(50)}
    assert len(names) == 50


def test_assign_ranks_waits_for_nnodes() -> None:
    assert assign_ranks([ann("b"), ann("a")], 3) is None
    assert assign_ranks([ann("b"), ann("a"), ann("c")], 3) == ("a", "b", "c")


def test_assign_ranks_counts_hosts_not_instances() -> None:
    # A renamed duplicate ("s-a-2") is the same host: still one node.
    assert assign_ranks([ann("a"), ann("a", instance="s-a-2"), ann("b")], 3) is None


def test_assign_ranks_refuses_extra_hosts() -> None:
    with pytest.raises(ClusterSpecError, match=r"3 hosts .* RALLYPOINT_NNODES=2: a,b,c"):
        assign_ranks([ann("c"), ann("a"), ann("b")], 2)


@pytest.mark.parametrize(
    ("items", "nnodes", "fault"),
    [([ann("a", "s1"), ann("b", "s2")], 2, "several sessions"), ([ann("a")], 0, "at least 1")],
)
def test_assign_ranks_refuses_bad_input(items: list[Announcement], nnodes: int, fault: str) -> None:
    with pytest.raises(ClusterSpecError, match=fault):
        assign_ranks(items, nnodes)


hosts = st.lists(
    st.from_regex(r"[a-z][a-z0-9-]{0,10}[a-z0-9]", fullmatch=True), min_size=1, max_size=12
)


@settings(max_examples=200)
@given(hosts, st.randoms(use_true_random=False))
def test_every_permutation_agrees(names: list[str], rnd: random.Random) -> None:
    items = [ann(h) for h in names]
    nnodes = len(set(names))
    expected = assign_ranks(items, nnodes)
    shuffled = list(items)
    rnd.shuffle(shuffled)
    # Each node sees the same announcements in its own arrival order, repeats included.
    assert assign_ranks(shuffled + shuffled[:2], nnodes) == expected
    assert expected is not None
    assert sorted(expected) == list(expected)
    assert set(expected) == set(names)
