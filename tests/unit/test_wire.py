"""wire/: peer messages round-trip, and anything else is a PeerMessageError naming the field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterDoc, Member
from rallypoint.reasons import Reason
from rallypoint.wire import alive as wirealive
from rallypoint.wire import batch as wirebatch
from rallypoint.wire import cluster, fields, jobstates, routes

MEMBERS = (
    Member(0, "node0", ("10.0.0.1",), 2222),
    Member(1, "node1.example.com", ("10.0.0.2", "fd00::2"), None),
)
DOC = ClusterDoc("sess", "abc.1", "node0", 29500, MEMBERS)


def doc_json(**changes: object) -> bytes:
    data = json.loads(cluster.encode_cluster_doc(DOC))
    data.update(changes)
    return json.dumps(data).encode()


def join_json(**changes: object) -> bytes:
    data: dict[str, object] = {
        "session": "sess",
        "rank": 1,
        "host": "node1",
        "addresses": ["10.0.0.2"],
        "tf_port": 2222,
    }
    data.update(changes)
    return json.dumps(data).encode()


def test_round_trips() -> None:
    assert cluster.parse_cluster_doc(cluster.encode_cluster_doc(DOC)) == DOC
    request = wire.JoinRequest("sess", MEMBERS[1], "abc.1")
    assert wire.parse_join(wire.encode_join(request)) == request
    answer = wire.JoinAnswer("sess", "abc", None, 1, 2)
    assert wire.parse_join_answer(wire.encode_join_answer(answer)) == answer
    poke = wire.Poke("sess", "abc")
    assert wire.parse_poke(wire.encode_poke(poke)) == poke


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"", "not JSON"),
        (b"[1]", "Expected `object`, got `array`"),
        (b"\xff", "not JSON"),
        (b"{" * 5000, "not JSON"),
        (b'{"unknown": ' + b"[" * 5000 + b"]" * 5000 + b"}", "not JSON (nested too deeply)"),
        (join_json(session=""), "Expected 1-256 printable ASCII characters - at `$.session`"),
        (join_json(session="has space"), "session"),
        (join_json(rank=True), "rank"),
        (join_json(rank=-1), "rank"),
        (join_json(rank="1"), "rank"),
        (join_json(host="bad_host!"), "host"),
        (join_json(host="-leading"), "host"),
        (join_json(host="a" * 254), "host"),
        (join_json(addresses="10.0.0.2"), "addresses"),
        (join_json(addresses=["10.0.0.256"]), "addresses[0] must be an IP address"),
        (join_json(addresses=[7]), "$.addresses[0]"),
        (join_json(addresses=["10.0.0.1"] * 65), "addresses"),
        (join_json(tf_port=0), "tf_port"),
        (join_json(tf_port=65536), "tf_port"),
        (
            join_json(generation_seen="has space"),
            "Expected 1-64 characters of A-Z a-z 0-9 . _ : - - at `$.generation_seen`",
        ),
        (join_json(generation_seen="x" * 65), "generation_seen"),
        (b" " * (wire.MAX_JOIN_BYTES + 1), "over the limit"),
    ],
)
def test_bad_join_bodies(body: bytes, field: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^join request: .*{re.escape(field)}"):
        wire.parse_join(body)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (doc_json(members=[]), "members"),
        (doc_json(members=[{"rank": 1, "host": "x", "addresses": []}]), "expected 0"),
        (doc_json(members=["x"]), r"Expected `object`, got `str` - at `\$\.members\[0\]`"),
        (doc_json(members=[{"rank": 0, "host": "a!", "addresses": []}]), r"members\[0\]: host"),
        (doc_json(master_host="node1"), "master_host"),
        (doc_json(master_port=0), "master_port"),
        (doc_json(generation=""), "generation"),
        (
            doc_json(
                members=[
                    {"rank": 0, "host": "a", "addresses": []},
                    {"rank": 1, "host": "A", "addresses": []},
                ],
                master_host="a",
            ),
            "twice",
        ),
    ],
)
def test_bad_cluster_documents(body: bytes, field: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^cluster document: .*{field}"):
        cluster.parse_cluster_doc(body)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("10.0.0.1", "10.0.0.1"), ("FD00:0:0::2", "fd00::2"), ("::ffff:10.0.0.1", "::ffff:a00:1")],
)
def test_addresses_are_canonical(value: str, canonical: str) -> None:
    assert fields.address(value) == canonical


@pytest.mark.parametrize("host", ["node1", "gpu-01.cluster.local", "10.0.0.1", "fd00::1", "a_b"])
def test_host_names_accepted(host: str) -> None:
    assert fields.host_name(host)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


Parse = Callable[[bytes], object]
#: Every parser of a peer's (or `run`'s) message.
PARSERS: tuple[Parse, ...] = (
    wire.parse_join,
    wire.parse_join_answer,
    wire.parse_poke,
    cluster.parse_cluster_doc,
    wire.parse_report,
    wire.parse_verdict,
    wirebatch.parse_join_batch,
    wirebatch.parse_report_batch,
    wirealive.parse_alive,
    wirealive.parse_answer,
    jobstates.parse_report,
    routes.parse_mesh,
)


@settings(max_examples=200)
@given(
    st.one_of(
        st.binary(max_size=200),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.dictionaries(
            st.sampled_from(
                [
                    "session",
                    "rank",
                    "host",
                    "addresses",
                    "tf_port",
                    "epoch",
                    "generation",
                    "joined",
                    "nnodes",
                    "members",
                    "master_host",
                    "master_port",
                    "probe_port",
                    "passed",
                    "failures",
                    "busy",
                    "net",
                    "seen",
                    "version",
                    "verified",
                    "pending",
                    "warnings",
                    "relay",
                    "reports",
                    "heard",
                    "job",
                    "jobs",
                    "first",
                    "down",
                    "total",
                    "counts",
                    "state",
                    "started",
                    "code",
                    "signal",
                ]
            ),
            json_values,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_parsers_never_crash(body: bytes) -> None:
    for parse in PARSERS:
        try:
            parse(body)
        except PeerMessageError as exc:
            assert "\n" not in str(exc) and "matching regex" not in str(exc)  # one line, in words


@pytest.mark.parametrize("parse", PARSERS)
def test_a_field_nested_too_deeply_is_not_json_to_every_parser(parse: Parse) -> None:
    """msgspec skips a field it does not know by recursing: too deep is an error, not a crash."""
    body = b'{"unknown": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(PeerMessageError, match=r"not JSON|over the limit"):
        parse(body)


def test_the_coordinator_port_round_trips_and_is_checked() -> None:
    member = Member(rank=0, host="main1", addresses=("10.0.0.1",), tf_port=2222, jax_port=8476)
    doc = ClusterDoc("s", "g.1", "main1", 29500, (member,))
    assert cluster.parse_cluster_doc(cluster.encode_cluster_doc(doc)).members[0].jax_port == 8476
    body = json.loads(cluster.encode_cluster_doc(doc))
    del body["members"][0]["jax_port"]  # a sidecar that serves no JAX sends none
    assert cluster.parse_cluster_doc(json.dumps(body).encode()).members[0].jax_port is None
    body["members"][0]["jax_port"] = 70000
    with pytest.raises(PeerMessageError, match="jax_port"):
        cluster.parse_cluster_doc(json.dumps(body).encode())


def test_a_join_carries_the_members_fields_beside_the_session() -> None:
    body = json.loads(wire.encode_join(wire.JoinRequest("sess", MEMBERS[1], None)))
    assert body == {
        "session": "sess",
        "generation_seen": None,
        "rank": 1,
        "host": "node1.example.com",
        "addresses": ["10.0.0.2", "fd00::2"],
        "tf_port": None,
        "jax_port": None,
        "probe_port": None,
    }


def test_fields_at_their_defaults_are_left_out_as_older_peers_sent_them() -> None:
    report = wire.Report("sess", "g.1", 1, "node1", True)
    assert set(json.loads(wire.encode_report(report))) == {
        "session",
        "generation",
        "rank",
        "host",
        "passed",
    }
    assert wire.parse_report(wire.encode_report(report)) == report
    verdict = wire.Verdict("sess", "g.1", 2, False, (1,), 1, (), 0, ())
    body = json.loads(wire.encode_verdict(verdict))
    assert "clock" not in body and body["pending"] == [1] and body["warnings"] == []


def test_equal_messages_are_equal_bytes_with_sorted_keys() -> None:
    def report(busy: list[str]) -> bytes:
        return wire.encode_report(
            wire.Report("sess", "g.1", 1, "node1", False, busy=frozenset(busy))
        )

    first, second = report(["tf", "jax", "probe"]), report(["probe", "jax", "tf"])
    assert first == second
    data = json.loads(first)
    assert data["busy"] == ["jax", "probe", "tf"]
    assert list(data) == sorted(data)


def test_a_reason_in_any_language_round_trips() -> None:
    failure = Reason("port_busy", "Port 29500 est occupé · 端口被占用", "node1", None, (1,))
    report = wire.Report("sess", "g.1", 1, "node1", False, failures=(failure,))
    body = wire.encode_report(report)
    assert json.loads(body)["failures"] == [failure.as_json()]
    assert wire.parse_report(body).failures == (failure,)
