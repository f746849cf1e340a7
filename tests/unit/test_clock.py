"""Clock offsets (core/clock.py) and their wire fields (wire/stamps.py): arithmetic, texts."""

from __future__ import annotations

import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rallypoint import wire
from rallypoint.auth import NONCE_HEADER, Authenticator
from rallypoint.core import clock
from rallypoint.core.clock import ClockFacts, ClockStamp
from rallypoint.errors import AuthError, PeerMessageError
from rallypoint.model import ClusterSpec

NONCE = "0123456789abcdef0123456789abcdef"


def exchange(
    ahead_s: float, out_s: float, back_s: float, hold_s: float = 0.0, start: float = 1e9
) -> tuple[float, float, float, float]:
    """t1..t4 for a node ``ahead_s`` ahead of the master, with one-way delays and a hold."""
    t1 = start + ahead_s
    t2 = start + out_s
    t3 = t2 + hold_s
    t4 = start + out_s + hold_s + back_s + ahead_s
    return t1, t2, t3, t4


@pytest.mark.parametrize(
    ("ahead_s", "out_s", "back_s", "hold_s"),
    [
        (600.0, 0.0002, 0.0002, 0.0),
        (-600.0, 0.001, 0.001, 0.0),
        (0.3, 0.0005, 0.0005, 1.5),  # a long-poll held 1.5 s: not part of the round trip
        (0.0, 0.01, 0.01, 0.0),
    ],
)
def test_symmetric_delays_give_the_exact_offset(
    ahead_s: float, out_s: float, back_s: float, hold_s: float
) -> None:
    got = clock.sample(*exchange(ahead_s, out_s, back_s, hold_s))
    assert got is not None
    assert got.offset_s == pytest.approx(ahead_s, abs=1e-6)
    assert got.rtt_s == pytest.approx(out_s + back_s, abs=1e-6)


def test_asymmetric_delays_err_by_at_most_half_the_round_trip() -> None:
    got = clock.sample(*exchange(600.0, 0.009, 0.001))
    assert got is not None
    assert got.rtt_s == pytest.approx(0.010)
    assert abs(got.offset_s - 600.0) <= got.rtt_s / 2 + 1e-9
    assert got.offset_s == pytest.approx(600.0 - 0.004)


def test_impossible_stamps_are_no_sample() -> None:
    # The master claims to have held the request 2 s, but the whole exchange took 1 s here.
    assert clock.sample(100.0, 50.0, 52.0, 101.0) is None


def test_the_estimate_is_the_lowest_round_trip_of_the_last_few() -> None:
    wall = [1000.0]
    seen: list[float] = []
    estimate = clock.ClockEstimate(lambda: wall[0], on_change=seen.append)
    assert estimate.best is None and estimate.offset_s == 0.0 and estimate.facts() is None
    estimate.add(clock.Sample(600.5, 0.010))
    estimate.add(clock.Sample(600.1, 0.001))
    estimate.add(clock.Sample(599.0, 0.050))
    assert estimate.offset_s == 600.1
    assert estimate.now() == pytest.approx(1000.0 - 600.1)
    assert seen == [600.5, 600.1, 600.1]
    # The good sample ages out after SAMPLES_KEPT newer ones.
    for _ in range(clock.SAMPLES_KEPT):
        estimate.add(clock.Sample(42.0, 0.020, "relay"))
    assert estimate.offset_s == 42.0
    assert estimate.facts() == ClockFacts(42.0, 0.02, 3 + clock.SAMPLES_KEPT, "relay")


def test_the_master_never_corrects_its_clock() -> None:
    estimate = clock.ClockEstimate(lambda: 500.0)
    estimate.reference = True
    estimate.add(clock.Sample(600.0, 0.001))
    assert estimate.now() == 500.0 and estimate.facts() is None
    stamp = estimate.stamp(499.5, NONCE)
    assert stamp == ClockStamp(499.5, 500.0, "master", NONCE)


def test_a_relay_stamps_only_once_it_measured_its_own_offset() -> None:
    estimate = clock.ClockEstimate(lambda: 1605.0)
    assert estimate.stamp(1000.0, None) is None
    estimate.add(clock.Sample(5.0, 0.001))
    assert estimate.stamp(1000.0, None) == ClockStamp(1000.0, 1600.0, "relay", None)


def test_the_warning_names_the_node_the_offset_and_the_round_trip() -> None:
    text = clock.warning("sub2", ClockFacts(600.24, 0.0004, 3, "master"))
    assert text.startswith("sub2's clock is 600.2 s ahead of the master's (measured over a 0.4 ms")
    assert "run NTP on every node" in text
    behind = clock.warning("sub1", ClockFacts(-2.0, 0.001, 1, "relay"))
    assert "2.0 s behind the master's (measured through its relay" in behind


@pytest.mark.parametrize(("by_peer", "expect"), [(True, "600 s ahead of"), (False, "600 s behind")])
def test_the_workers_reason_gives_the_offset(by_peer: bool, expect: str) -> None:
    reason = clock.skew_reason("main1", 600.2, 30.0, None, by_peer=by_peer)
    assert reason.code == "clock_skew" and reason.host == "main1" and reason.detail == "+600.2"
    assert expect in reason.message and "main1" in reason.message


def test_the_masters_reason_names_the_node_and_its_clock() -> None:
    reason = clock.refused_reason("sub2", 2, 600.0, 30.0)
    assert reason.code == "clock_skew" and reason.ranks == (2,)
    assert reason.message.startswith("sub2 has not joined: its messages are 600 s ahead of")


SPEC = ClusterSpec("explicit", ("main1", "sub1", "sub2"), 0, 3, "s")


@pytest.mark.parametrize(
    ("body", "host"),
    [
        (b'{"host": "SUB2", "rank": 2}', "sub2"),
        (b'{"relay": 1, "members": []}', "sub1"),
        (b'{"host": "elsewhere"}', None),
        (b"", None),
        (b"[1]", None),
        (b"not json", None),
        (b'{"relay": true}', None),
    ],
)
def test_the_sender_of_a_refused_body(body: bytes, host: str | None) -> None:
    assert clock.sender_host(body, SPEC) == host


# -- the wire fields ----------------------------------------------------------------------


def test_stamps_and_facts_round_trip_through_the_messages() -> None:
    stamp = ClockStamp(1_700_000_000.25, 1_700_000_000.5, "relay", NONCE)
    answer = wire.JoinAnswer("s", "ep", None, 1, 3, clock=stamp)
    assert wire.parse_join_answer(wire.encode_join_answer(answer)) == answer
    verdict = wire.Verdict("s", "g", 1, False, (), 0, (), 0, (), clock=stamp)
    assert wire.parse_verdict(wire.encode_verdict(verdict)) == verdict
    report = wire.Report("s", "g", 2, "sub2", True, clock=ClockFacts(600.2, 0.0004, 3))
    assert wire.parse_report(wire.encode_report(report)) == report


def test_messages_without_clocks_still_parse_and_encode_as_before() -> None:
    answer = wire.JoinAnswer("s", "ep", None, 1, 3)
    assert b"clock" not in wire.encode_join_answer(answer)
    assert wire.parse_join_answer(wire.encode_join_answer(answer)).clock is None
    assert b"clock" not in wire.encode_report(wire.Report("s", "g", 1, "sub1", True))


GOOD_STAMP = {"received": 1e9, "answered": 1e9 + 0.5, "source": "master", "nonce": NONCE}
GOOD_FACTS = {"offset_s": 600.0, "rtt_s": 0.001, "samples": 2, "source": "master"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"received": "yesterday"}, "clock.received"),
        ({"received": None}, "clock.received"),
        ({"received": True}, "clock.received"),
        ({"received": -1}, "clock.received"),
        ({"answered": 10**400}, "clock.answered"),
        ({"answered": 1e13}, "clock.answered"),
        ({"answered": 1e9 - 1}, "clock.answered"),  # answered before it was received
        ({"answered": 1e9 + 90000}, "clock.answered"),  # held for more than a day
        ({"nonce": "x" * 32}, "clock.nonce"),
        ({"nonce": 7}, "clock.nonce"),
        ({"source": "mars"}, "clock.source"),
        ({"source": None}, "clock.source"),
    ],
)
def test_a_bad_stamp_is_an_error_naming_the_field(change: dict[str, object], field: str) -> None:
    body = json.dumps(
        {"session": "s", "epoch": "ep", "generation": None, "joined": 1, "nnodes": 3}
        | {"clock": GOOD_STAMP | change}
    ).encode()
    with pytest.raises(PeerMessageError, match=f"^join answer: .*{re.escape(field)}"):
        wire.parse_join_answer(body)


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_json_non_numbers_are_refused(raw: bytes) -> None:
    """NaN and Infinity are not JSON; a number too large for a float is out of range."""
    verdict = wire.Verdict("s", "g", 1, False, (), 0, (), 0, ())
    body = wire.encode_verdict(verdict)[:-1] + (
        b',"clock":{"received":' + raw + b',"answered":1,"source":"master"}}'
    )
    with pytest.raises(PeerMessageError, match=r"^verdict: (not JSON|.*clock\.received)"):
        wire.parse_verdict(body)
    assert wire.parse_verdict(body.replace(raw, b"0.5")).clock is not None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"offset_s": "600"}, "clock.offset_s"),
        ({"offset_s": 1e13}, "clock.offset_s"),
        ({"rtt_s": -0.1}, "clock.rtt_s"),
        ({"rtt_s": 7200}, "clock.rtt_s"),
        ({"samples": 0}, "clock.samples"),
        ({"samples": 1.5}, "clock.samples"),
        ({"samples": False}, "clock.samples"),
        ({"source": "self"}, "clock.source"),
    ],
)
def test_bad_clock_facts_in_a_report_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(PeerMessageError, match=f"^report: .*{re.escape(field)}"):
        wire.parse_report(report_with_clock(GOOD_FACTS | change))


def report_with_clock(clock: object) -> bytes:
    data = json.loads(wire.encode_report(wire.Report("s", "g", 1, "sub1", True)))
    data["clock"] = clock
    return json.dumps(data).encode()


def verdict_with_clock(clock: object) -> bytes:
    data = json.loads(wire.encode_verdict(wire.Verdict("s", "g", 1, False, (), 0, (), 0, ())))
    data["clock"] = clock
    return json.dumps(data).encode()


@pytest.mark.parametrize("value", [[], "600", 600, True])
def test_a_clock_that_is_not_an_object_is_refused(value: object) -> None:
    with pytest.raises(PeerMessageError, match=r"^report: Expected `object.*\$\.clock"):
        wire.parse_report(report_with_clock(value))
    with pytest.raises(PeerMessageError, match=r"^verdict: Expected `object.*\$\.clock"):
        wire.parse_verdict(verdict_with_clock(value))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
STAMP_LIKE = st.fixed_dictionaries(
    {}, optional={k: JSON for k in ("received", "answered", "source", "nonce")}
)
FACTS_LIKE = st.fixed_dictionaries(
    {}, optional={k: JSON for k in ("offset_s", "rtt_s", "samples", "source")}
)


@given(STAMP_LIKE | JSON)
def test_any_stamp_is_a_value_or_a_clear_error(value: object) -> None:
    try:
        stamp = wire.parse_verdict(verdict_with_clock(value)).clock
    except PeerMessageError:
        return
    if stamp is not None:
        assert math.isfinite(stamp.received) and stamp.received <= stamp.answered


@given(FACTS_LIKE | JSON)
def test_any_clock_facts_are_a_value_or_a_clear_error(value: object) -> None:
    try:
        facts = wire.parse_report(report_with_clock(value)).clock
    except PeerMessageError:
        return
    if facts is not None:
        assert math.isfinite(facts.offset_s) and facts.rtt_s >= 0 and facts.samples >= 1


# -- authentication: the skew a stale refusal carries, and a refusal that proves itself ----


def test_a_stale_message_carries_the_senders_skew() -> None:
    ahead = Authenticator("t", clock=lambda: 2_000_600.0)
    here = Authenticator("t", clock=lambda: 2_000_000.0)
    headers = ahead.sign("POST /v1/join", b"{}")
    with pytest.raises(AuthError) as caught:
        here.verify("POST /v1/join", b"{}", headers)
    assert caught.value.reason == "stale" and caught.value.skew_s == 600.0


def test_replay_cache_staleness_is_not_a_clock_skew() -> None:
    auth = Authenticator("t", clock=lambda: 2_000_000.0)
    auth.nonce_cache_size = 1
    auth.verify("c", b"", auth.sign("c", b""))
    auth.verify("c", b"", auth.sign("c", b""))  # evicts the first while fresh: a horizon
    old = Authenticator("t", clock=lambda: 2_000_000.0 - 1).sign("c", b"")
    with pytest.raises(AuthError) as caught:
        auth.verify("c", b"", old)
    assert caught.value.reason == "stale" and caught.value.skew_s is None


def test_an_echoing_refusal_is_accepted_whatever_its_age() -> None:
    master = Authenticator("t", clock=lambda: 1_000_000.0)
    worker = Authenticator("t", clock=lambda: 1_000_600.0)
    sent = worker.sign("POST /v1/join", b"{}")[NONCE_HEADER]
    body = b'{"error": "stale"}'
    headers = master.sign("401 /v1/join", body)
    with pytest.raises(AuthError, match="600s behind"):
        worker.verify("401 /v1/join", body, headers)  # 600 s old to the worker's clock
    worker.verify_echo("401 /v1/join", body, headers, sent=sent, echoed=sent)
    with pytest.raises(AuthError, match="another request's nonce"):
        worker.verify_echo("401 /v1/join", body, headers, sent=sent, echoed=NONCE)
    forged = Authenticator("other", clock=lambda: 1_000_000.0).sign("401 /v1/join", body)
    with pytest.raises(AuthError, match="bad signature"):
        worker.verify_echo("401 /v1/join", body, forged, sent=sent, echoed=sent)
