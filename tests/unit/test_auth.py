"""auth: HMAC signing and checking of peer messages and mDNS TXT fields."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from rallypoint.auth import (
    NONCE_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Authenticator,
)
from rallypoint.errors import AuthError

TOKEN = "correct-horse-battery-staple-7f3a"
CONTEXT = "POST /v1/join"
BODY = b'{"rank": 1, "host": "node1"}'


class FakeClock:
    """A wall clock the test moves by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def auth(clock: FakeClock) -> Authenticator:
    return Authenticator(TOKEN, clock=clock)


def flip(text: str, index: int) -> str:
    """``text`` with one hex digit (or character) changed."""
    old = text[index]
    new = "0" if old != "0" else "1"
    return text[:index] + new + text[index + 1 :]


def test_round_trip(auth: Authenticator) -> None:
    headers = auth.sign(CONTEXT, BODY)
    assert set(headers) == {TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER}
    auth.verify(CONTEXT, BODY, headers)


def test_round_trip_between_two_nodes(clock: FakeClock) -> None:
    sender = Authenticator(TOKEN, clock=clock)
    receiver = Authenticator(TOKEN, clock=clock)
    receiver.verify(CONTEXT, BODY, sender.sign(CONTEXT, BODY))


def test_header_lookup_is_case_insensitive(auth: Authenticator) -> None:
    headers = {key.lower(): value for key, value in auth.sign(CONTEXT, BODY).items()}
    auth.verify(CONTEXT, BODY, headers)


def test_every_signature_is_different(auth: Authenticator) -> None:
    first, second = auth.sign(CONTEXT, BODY), auth.sign(CONTEXT, BODY)
    assert first[NONCE_HEADER] != second[NONCE_HEADER]
    assert first[SIGNATURE_HEADER] != second[SIGNATURE_HEADER]


@pytest.mark.parametrize("missing", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
def test_unsigned_is_rejected(auth: Authenticator, missing: str) -> None:
    headers = auth.sign(CONTEXT, BODY)
    del headers[missing]
    with pytest.raises(AuthError, match=f"unsigned POST /v1/join: no {missing}"):
        auth.verify(CONTEXT, BODY, headers)


def test_no_headers_at_all_is_rejected(auth: Authenticator) -> None:
    with pytest.raises(AuthError, match="unsigned"):
        auth.verify(CONTEXT, BODY, {})


def test_duplicate_header_is_rejected(auth: Authenticator) -> None:
    headers = CIMultiDict(auth.sign(CONTEXT, BODY))
    headers.add(SIGNATURE_HEADER.lower(), "0" * 64)
    with pytest.raises(AuthError, match="appears twice"):
        auth.verify(CONTEXT, BODY, headers)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        (TIMESTAMP_HEADER, "-5"),
        (TIMESTAMP_HEADER, "1.5"),
        (TIMESTAMP_HEADER, ""),
        (TIMESTAMP_HEADER, "1" * 13),
        (NONCE_HEADER, "xyz"),
        (NONCE_HEADER, "A" * 32),
        (NONCE_HEADER, "0" * 31),
        (SIGNATURE_HEADER, "0" * 63),
        (SIGNATURE_HEADER, "g" * 64),
        (SIGNATURE_HEADER, "ä" * 64),
    ],
)
def test_malformed_is_rejected(auth: Authenticator, header: str, value: str) -> None:
    headers = auth.sign(CONTEXT, BODY)
    headers[header] = value
    with pytest.raises(AuthError, match="malformed"):
        auth.verify(CONTEXT, BODY, headers)


@pytest.mark.parametrize("index", [0, 5, len(BODY) - 1])
def test_tampered_body_is_rejected(auth: Authenticator, index: int) -> None:
    headers = auth.sign(CONTEXT, BODY)
    tampered = bytearray(BODY)
    tampered[index] ^= 0x01
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify(CONTEXT, bytes(tampered), headers)


@pytest.mark.parametrize(
    "context", ["POST /v1/joi", "POST /v1/join ", "GET /v1/join", "200 /v1/cluster", ""]
)
def test_other_context_is_rejected(auth: Authenticator, context: str) -> None:
    headers = auth.sign(CONTEXT, BODY)
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify(context, BODY, headers)


@pytest.mark.parametrize("header", [TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER])
@pytest.mark.parametrize("index", [0, -1])
def test_tampered_header_is_rejected(auth: Authenticator, header: str, index: int) -> None:
    headers = auth.sign(CONTEXT, BODY)
    headers[header] = flip(headers[header], index % len(headers[header]))
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify(CONTEXT, BODY, headers)


@settings(max_examples=200)
@given(st.binary(max_size=64), st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_any_changed_body_byte_is_rejected(body: bytes, position: int, delta: int) -> None:
    signer = Authenticator(TOKEN, clock=FakeClock())
    headers = signer.sign(CONTEXT, body)
    changed = bytearray(body + b"x")  # also covers appending a byte
    changed[position % len(changed)] ^= delta or 1
    with pytest.raises(AuthError):
        signer.verify(CONTEXT, bytes(changed), headers)


def test_framing_is_unambiguous(auth: Authenticator) -> None:
    # Moving a digit from the timestamp to the end of the context must break the signature.
    headers = auth.sign("POST /v1/join", BODY)
    timestamp = headers[TIMESTAMP_HEADER]
    moved = dict(headers, **{TIMESTAMP_HEADER: timestamp[1:]})
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify("POST /v1/join" + timestamp[0], BODY, moved)


def test_other_token_is_rejected(clock: FakeClock) -> None:
    headers = Authenticator("another-secret", clock=clock).sign(CONTEXT, BODY)
    with pytest.raises(AuthError, match="same RALLYPOINT_TOKEN"):
        Authenticator(TOKEN, clock=clock).verify(CONTEXT, BODY, headers)


def test_replay_is_rejected(auth: Authenticator) -> None:
    headers = auth.sign(CONTEXT, BODY)
    auth.verify(CONTEXT, BODY, headers)
    with pytest.raises(AuthError, match="replayed"):
        auth.verify(CONTEXT, BODY, headers)


def test_forged_message_does_not_burn_the_nonce(auth: Authenticator) -> None:
    headers = auth.sign(CONTEXT, BODY)
    forged = dict(headers, **{SIGNATURE_HEADER: flip(headers[SIGNATURE_HEADER], 0)})
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify(CONTEXT, BODY, forged)
    auth.verify(CONTEXT, BODY, headers)


@pytest.mark.parametrize(
    ("offset", "accepted"), [(-30, True), (30, True), (-31, False), (31, False)]
)
def test_skew_limit(clock: FakeClock, offset: float, accepted: bool) -> None:
    sender = Authenticator(TOKEN, clock=FakeClock(clock.now + offset))
    receiver = Authenticator(TOKEN, clock=clock, max_skew_s=30)
    headers = sender.sign(CONTEXT, BODY)
    if accepted:
        receiver.verify(CONTEXT, BODY, headers)
    else:
        with pytest.raises(AuthError, match="synchronise the clocks"):
            receiver.verify(CONTEXT, BODY, headers)


def test_stale_after_waiting(auth: Authenticator, clock: FakeClock) -> None:
    headers = auth.sign(CONTEXT, BODY)
    clock.now += 120
    with pytest.raises(AuthError, match="120s behind"):
        auth.verify(CONTEXT, BODY, headers)


def test_replay_after_the_nonce_was_pruned_is_stale(auth: Authenticator, clock: FakeClock) -> None:
    old = auth.sign(CONTEXT, BODY)
    auth.verify(CONTEXT, BODY, old)
    clock.now += 31
    auth.verify(CONTEXT, BODY, auth.sign(CONTEXT, BODY))  # prunes the old nonce
    with pytest.raises(AuthError, match="behind"):
        auth.verify(CONTEXT, BODY, old)


def test_nonce_cache_is_bounded_and_stays_safe(auth: Authenticator, clock: FakeClock) -> None:
    auth.nonce_cache_size = 4
    first = auth.sign(CONTEXT, BODY)
    auth.verify(CONTEXT, BODY, first)
    later = []
    for _ in range(6):
        clock.now += 1
        later.append(auth.sign(CONTEXT, BODY))
        auth.verify(CONTEXT, BODY, later[-1])
    assert len(auth._seen) <= 4
    # The first nonce was evicted while still fresh: its replay is refused all the same.
    with pytest.raises(AuthError, match="replay cache"):
        auth.verify(CONTEXT, BODY, first)
    with pytest.raises(AuthError, match="replayed"):
        auth.verify(CONTEXT, BODY, later[-1])


Rejection = Callable[[Authenticator, FakeClock], None]


def _unsigned(a: Authenticator, c: FakeClock) -> None:
    a.verify(CONTEXT, BODY, {})


def _bad_signature(a: Authenticator, c: FakeClock) -> None:
    a.verify(CONTEXT, BODY, Authenticator(TOKEN + "x", clock=c).sign(CONTEXT, BODY))


def _stale(a: Authenticator, c: FakeClock) -> None:
    headers = a.sign(CONTEXT, BODY)
    c.now += 1000
    a.verify(CONTEXT, BODY, headers)


def _replayed(a: Authenticator, c: FakeClock) -> None:
    headers = a.sign(CONTEXT, BODY)
    a.verify(CONTEXT, BODY, headers)
    a.verify(CONTEXT, BODY, headers)


def _malformed(a: Authenticator, c: FakeClock) -> None:
    a.verify(CONTEXT, BODY, dict(a.sign(CONTEXT, BODY), **{NONCE_HEADER: TOKEN}))


def _context_with_token(a: Authenticator, c: FakeClock) -> None:
    a.verify(CONTEXT, BODY + b"!", a.sign(CONTEXT, BODY))


def _unsigned_fields(a: Authenticator, c: FakeClock) -> None:
    a.verify_fields({"session": "s"})


def _bad_fields(a: Authenticator, c: FakeClock) -> None:
    a.verify_fields(dict(a.sign_fields({"session": "s"}), session="t"))


@pytest.mark.parametrize(
    "reject",
    [
        _unsigned,
        _bad_signature,
        _stale,
        _replayed,
        _malformed,
        _context_with_token,
        _unsigned_fields,
        _bad_fields,
    ],
)
def test_token_never_appears_in_errors(reject: Rejection) -> None:
    clock = FakeClock()
    auth = Authenticator(TOKEN, clock=clock)
    with pytest.raises(AuthError) as caught:
        reject(auth, clock)
    shown = f"{caught.value} {caught.value!r} {auth!r}"
    assert TOKEN not in shown
    assert TOKEN[:8] not in shown
    assert "\n" not in str(caught.value)


def test_context_with_control_characters_stays_on_one_line(auth: Authenticator) -> None:
    with pytest.raises(AuthError) as caught:
        auth.verify("POST /v1/join\nX-Evil: 1", BODY, {})
    assert "\n" not in str(caught.value)


def test_disabled_is_a_no_op() -> None:
    auth = Authenticator(None)
    assert not auth.enabled
    assert auth.sign(CONTEXT, BODY) == {}
    auth.verify(CONTEXT, BODY, {})
    auth.verify(CONTEXT, BODY, {SIGNATURE_HEADER: "garbage"})
    fields = {"session": "s1", "rank": "2"}
    assert auth.sign_fields(fields) == fields
    auth.verify_fields({"anything": "goes"})


def test_enabled_flag(auth: Authenticator) -> None:
    assert auth.enabled


@pytest.mark.parametrize("token", ["", "   "])
def test_empty_token_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        Authenticator(token)


FIELDS = {"session": "job-17", "rank": "3", "port": "7781", "gen": "a1b2"}


def test_fields_round_trip(auth: Authenticator) -> None:
    signed = auth.sign_fields(FIELDS)
    assert {k: signed[k] for k in FIELDS} == FIELDS
    assert {"ts", "nonce", "sig"} <= set(signed)
    auth.verify_fields(signed)
    # mDNS repeats records: the same record is accepted again.
    auth.verify_fields(signed)
    auth.verify_fields(dict(reversed(list(signed.items()))))


@pytest.mark.parametrize("key", [*FIELDS, "ts", "nonce"])
def test_tampered_field_is_rejected(auth: Authenticator, key: str) -> None:
    signed = auth.sign_fields(FIELDS)
    signed[key] = flip(signed[key], 0)
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify_fields(signed)


def test_added_or_removed_field_is_rejected(auth: Authenticator) -> None:
    signed = auth.sign_fields(FIELDS)
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify_fields(dict(signed, extra="1"))
    del signed["gen"]
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify_fields(signed)


def test_moving_bytes_between_fields_is_rejected(auth: Authenticator) -> None:
    signed = auth.sign_fields({"ab": "c"})
    moved = {key: value for key, value in signed.items() if key != "ab"}
    with pytest.raises(AuthError, match="bad signature"):
        auth.verify_fields(dict(moved, a="bc"))


@pytest.mark.parametrize("missing", ["ts", "nonce", "sig"])
def test_unsigned_fields_are_rejected(auth: Authenticator, missing: str) -> None:
    signed = auth.sign_fields(FIELDS)
    del signed[missing]
    with pytest.raises(AuthError, match=f"unsigned announcement: no {missing}"):
        auth.verify_fields(signed)


def test_stale_fields_are_rejected(auth: Authenticator, clock: FakeClock) -> None:
    signed = auth.sign_fields(FIELDS)
    clock.now += 31
    with pytest.raises(AuthError, match="synchronise"):
        auth.verify_fields(signed)


def test_malformed_fields_are_rejected(auth: Authenticator) -> None:
    with pytest.raises(AuthError, match="malformed"):
        auth.verify_fields(dict(auth.sign_fields(FIELDS), ts="soon"))


@pytest.mark.parametrize("key", ["ts", "nonce", "sig"])
def test_reserved_field_names(auth: Authenticator, key: str) -> None:
    with pytest.raises(ValueError, match="reserved"):
        auth.sign_fields({key: "1"})
