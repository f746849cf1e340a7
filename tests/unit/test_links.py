"""Which links each node measures, and the warnings a cluster's measurements give."""

from __future__ import annotations

import json
import re
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint import wire
from rallypoint.core import links
from rallypoint.core.links import LinkStat
from rallypoint.errors import PeerMessageError
from rallypoint.net import tcpinfo
from rallypoint.wire.fields import dump

HOSTS = tuple(f"n{r}" for r in range(16))


def pairs(nnodes: int) -> set[tuple[int, int]]:
    return {(min(r, p), max(r, p)) for r in range(nnodes) for p in links.measured_peers(nnodes, r)}


@pytest.mark.parametrize("nnodes", [1, 2, 3, 5, 8])
def test_small_clusters_measure_every_pair_once(nnodes: int) -> None:
    assert pairs(nnodes) == {(a, b) for a in range(nnodes) for b in range(a + 1, nnodes)}
    assert sum(len(links.measured_peers(nnodes, r)) for r in range(nnodes)) == len(pairs(nnodes))


@pytest.mark.parametrize("nnodes", [9, 16, 64, 1000, 4096])
def test_large_clusters_measure_two_rings_linear_in_n(nnodes: int) -> None:
    measured = pairs(nnodes)
    assert len(measured) <= 2 * nnodes
    degree = {r: 0 for r in range(nnodes)}
    for a, b in measured:
        degree[a] += 1
        degree[b] += 1
    # Every node is an end of four links: a bad node shows as one whose every link is bad.
    assert min(degree.values()) == 4
    assert all(len(links.measured_peers(nnodes, r)) == 2 for r in range(nnodes))


@given(st.integers(2, 5000), st.data())
def test_measured_peers_are_other_valid_ranks(nnodes: int, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, nnodes - 1))
    peers = links.measured_peers(nnodes, rank)
    assert len(set(peers)) == len(peers)
    assert all(0 <= p < nnodes and p != rank for p in peers)


def link(peer: int, mbps: float = 1000.0, retrans: float = 0.0) -> LinkStat:
    return LinkStat(peer, mbps, mbps, retrans, retrans, 0.1, 1 << 20)


def test_a_clean_cluster_gives_no_warning() -> None:
    measured = {r: [link(p, 900 + 10 * r) for p in links.measured_peers(5, r)] for r in range(5)}
    assert links.judge(measured, HOSTS[:5]) == []


def test_a_slow_node_is_named_once_not_per_link() -> None:
    # n2's link is shaped: every link with n2 at one end is slow, the others are not.
    measured = {
        r: [link(p, 5.0 if 2 in (r, p) else 1000.0) for p in links.measured_peers(4, r)]
        for r in range(4)
    }
    warnings = links.judge(measured, HOSTS[:4])
    assert [(w.code, w.detail, w.ranks) for w in warnings] == [("slow_link", "node", (2,))]
    assert "every measured link of n2 is slow" in warnings[0].message
    assert "1,000 Mbit/s" in warnings[0].message


def test_a_slow_link_between_good_nodes_is_named_as_a_link() -> None:
    measured = {
        r: [link(p, 50.0 if {r, p} == {0, 3} else 1000.0) for p in links.measured_peers(4, r)]
        for r in range(4)
    }
    warnings = links.judge(measured, HOSTS[:4])
    assert {(w.code, w.detail, w.ranks) for w in warnings} == {
        ("slow_link", "link", (0, 3)),
        ("slow_link", "link", (3, 0)),
    }
    assert "the link n0 -> n3 carries 50.0 Mbit/s" in warnings[0].message


def test_one_slow_direction_is_named_with_its_direction() -> None:
    measured = {0: [LinkStat(1, 1000.0, 20.0)], 1: [LinkStat(2, 1000.0, 1000.0)]}
    warnings = links.judge(measured, HOSTS[:3])
    assert [(w.code, w.ranks) for w in warnings] == [("slow_link", (1, 0))]


def test_a_lossy_node_is_named() -> None:
    measured = {
        r: [link(p, retrans=0.09 if 1 in (r, p) else 0.0) for p in links.measured_peers(3, r)]
        for r in range(3)
    }
    warnings = links.judge(measured, HOSTS[:3])
    assert [(w.code, w.detail, w.ranks) for w in warnings] == [("lossy_link", "node", (1,))]
    assert "9.0%" in warnings[0].message


def test_two_nodes_have_nothing_to_compare_with() -> None:
    # One link: it is the cluster's best; only --min-link-mbps can call it slow.
    assert links.judge({0: [link(1, 1.0)]}, HOSTS[:2]) == []


def test_measurements_naming_unknown_ranks_are_ignored() -> None:
    assert links.judge({0: [link(7, 1.0), link(1)], 9: [link(0, 1.0)]}, HOSTS[:2]) == []


def report_with_links(items: object) -> bytes:
    data = json.loads(wire.encode_report(wire.Report("s", "g", 1, "n1", True)))
    data["links"] = items
    return json.dumps(data).encode()


def test_links_round_trip_through_their_json() -> None:
    original = (LinkStat(3, 1234.5, 99.25, 0.01, None, 0.25, 4096, False),)
    assert wire.parse_report(report_with_links(json.loads(dump(original)))).links == original


def test_a_measured_link_is_kept_at_the_precision_its_wire_form_carries() -> None:
    exact = LinkStat(3, 1234.56789, 0.0004, 0.0123456, None, 0.2501, 4096)
    rounded = exact.rounded()
    assert (rounded.up_mbps, rounded.down_mbps, rounded.up_retrans, rounded.rtt_ms) == (
        1234.568,
        0.0,
        0.01235,
        0.25,
    )
    assert rounded.down_retrans is None and rounded.bytes == 4096
    assert json.loads(dump(rounded))["up_mbps"] == 1234.568


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ("x", "Expected `object`, got `str` - at `$.links[0]`"),
        ({"peer": -1, "up_mbps": 1, "down_mbps": 1}, "peer"),
        ({"peer": True, "up_mbps": 1, "down_mbps": 1}, "peer"),
        ({"peer": 1, "up_mbps": "fast", "down_mbps": 1}, "up_mbps"),
        ({"peer": 1, "up_mbps": 1, "down_mbps": float("nan")}, "not JSON"),  # NaN is not JSON
        ({"peer": 1, "up_mbps": 1, "down_mbps": 1e12}, "down_mbps"),
        ({"peer": 1, "up_mbps": 10**400, "down_mbps": 1}, "up_mbps"),  # past any float
        ({"peer": 1, "up_mbps": 1, "down_mbps": 1, "up_retrans": 2}, "up_retrans"),
        ({"peer": 1, "up_mbps": 1, "down_mbps": 1, "bytes": -5}, "bytes"),
        ({"peer": 1, "up_mbps": 1, "down_mbps": 1, "complete": "yes"}, "complete"),
    ],
)
def test_bad_links_from_a_peer_name_the_field(item: object, field: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^report: .*{re.escape(field)}"):
        wire.parse_report(report_with_links([item]))


def test_too_many_links_are_refused() -> None:
    too_many = json.loads(dump([link(1)] * (wire.MAX_LINKS + 1)))
    with pytest.raises(PeerMessageError, match=r"^report: .*length <= 64 - at `\$\.links`"):
        wire.parse_report(report_with_links(too_many))


def test_tcp_info_fields_are_read_at_their_offsets_and_missing_ones_are_none() -> None:
    raw = bytearray(280)
    struct.pack_into("=Q", raw, 120, 70_000)  # bytes acked
    struct.pack_into("=I", raw, 148, 55)  # min_rtt
    struct.pack_into("=Q", raw, 200, 10_000)  # bytes sent
    struct.pack_into("=Q", raw, 208, 250)  # bytes retransmitted
    stats = tcpinfo.parse(bytes(raw))
    assert (stats.bytes_acked, stats.min_rtt_us, stats.bytes_sent, stats.bytes_retrans) == (
        70_000,
        55,
        10_000,
        250,
    )
    old = tcpinfo.parse(bytes(raw[:136]))  # a kernel of the 4.1 era: bytes acked, no more
    assert old.bytes_acked == 70_000 and old.min_rtt_us is None and old.bytes_sent is None


def test_a_slow_leg_is_named_against_the_best_leg_of_its_kind() -> None:
    # Up legs reach 5,000 Mbit/s here, down legs 1,000: a 20 Mbit/s down leg is judged, and
    # named, against 1,000.
    measured = {0: [LinkStat(1, 5000.0, 20.0, rtt_ms=0.004)], 1: [LinkStat(2, 5000.0, 1000.0)]}
    [warning] = links.judge(measured, HOSTS[:3])
    assert "the link n1 -> n0 carries 20.0 Mbit/s, the cluster's best links 1,000 Mbit/s" in (
        warning.message
    )
    assert "RTT 4 us" in warning.message
