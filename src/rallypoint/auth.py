"""HMAC-SHA256 signing and checking of peer messages and mDNS TXT records.

A signed HTTP message carries three headers: X-Rallypoint-Timestamp (integer Unix seconds),
X-Rallypoint-Nonce (32 hex digits) and X-Rallypoint-Signature (hex HMAC-SHA256). The MAC covers
a length-prefixed framing of a version tag, the context (method and path for requests, status
and path for responses), the timestamp, the nonce and the SHA-256 of the body, so no two
different messages share an encoding. Checks run in this order: format, signature (constant
time), clock skew, replay; a nonce is remembered only once the message proved authentic, so
forged traffic cannot fill the replay cache.

mDNS TXT fields are signed the same way over their sorted (key, value) pairs plus "ts" and
"nonce", and carry the MAC as "sig". An announcer re-signs and updates its record more often
than ``max_skew_s``: a record older than that is stale. Identical repeats of a record are
accepted, because mDNS repeats records by design (RFC 6762 section 8.3 and every answer).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path

from rallypoint.errors import AuthError, ConfigError

TIMESTAMP_HEADER = "X-Rallypoint-Timestamp"
NONCE_HEADER = "X-Rallypoint-Nonce"
SIGNATURE_HEADER = "X-Rallypoint-Signature"
_HEADERS = (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER)

#: TXT keys that sign_fields adds; callers may not use them for their own fields.
FIELD_KEYS = ("ts", "nonce", "sig")

#: Nonces remembered for replay detection; older ones are evicted first.
NONCE_CACHE_SIZE = 65536

_MESSAGE_TAG = b"rallypoint-message-v1"
_DIGEST_BYTES = hashlib.sha256().digest_size
_FIELDS_TAG = b"rallypoint-fields-v1"
_PROBE_TAG = b"rallypoint-probe-v1"
_DATA_TAG = b"rallypoint-probe-data-v1"
_LOCAL_TAG = b"rallypoint-local-write-v1"
#: The header a write to the local API proves the session token with (`Bearer <proof>`).
LOCAL_PROOF_HEADER = "Authorization"
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
_REMEDY = "give every node the same RALLYPOINT_TOKEN (or --token-file)"


def load_token(
    path: str | None, direct: str | None, *, where: str, both_from_env: bool = False
) -> str | None:
    """The session secret: the file at ``path`` (named ``where`` in messages), else ``direct``.

    ``both_from_env``: the path came from RALLYPOINT_TOKEN_FILE, so a RALLYPOINT_TOKEN
    beside it is ambiguous (a --token-file flag simply wins). ConfigError when the file
    cannot be read or is empty.
    """
    if path and direct and both_from_env:
        raise ConfigError("both RALLYPOINT_TOKEN and RALLYPOINT_TOKEN_FILE are set: keep one")
    if not path:
        return direct
    try:
        token = Path(path).read_text(encoding="utf-8").rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ConfigError(
            f"{where} {path!r} cannot be read ({reason}): check the path and its permissions"
        ) from exc
    if not token:
        raise ConfigError(f"{where} {path!r} is empty: put the session secret in it")
    return token


class Authenticator:
    """Signs and checks peer messages with a shared session secret; a no-op without one."""

    def __init__(
        self,
        token: str | None,
        *,
        max_skew_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if token is not None and not token.strip():
            raise ValueError(
                "the session token is empty; set a secret or leave RALLYPOINT_TOKEN unset"
            )
        if max_skew_s <= 0:
            raise ValueError(f"max_skew_s must be positive, got {max_skew_s}")
        self.enabled = token is not None
        self.max_skew_s = max_skew_s
        #: Nonces remembered for replay detection; beyond it the oldest are evicted.
        self.nonce_cache_size = NONCE_CACHE_SIZE
        self._key = token.encode("utf-8") if token is not None else b""
        self._clock = clock
        # nonce -> timestamp, in the order the messages were accepted.
        self._seen: OrderedDict[str, int] = OrderedDict()
        # Messages at or before this timestamp are refused: their nonce may have been evicted.
        self._horizon = -1

    def __repr__(self) -> str:
        return f"Authenticator(enabled={self.enabled}, max_skew_s={self.max_skew_s:g})"

    def sign(self, context: str, body: bytes) -> dict[str, str]:
        """The three signature headers for a message; {} when authentication is off."""
        if not self.enabled:
            return {}
        return self.sign_digest(context, hashlib.sha256(body).digest())

    def sign_digest(self, context: str, body_sha256: bytes) -> dict[str, str]:
        """sign() for a body given by its SHA-256 digest (32 bytes); the same headers.

        For a large body sent many times (the cluster document): each answer still gets its
        own timestamp and nonce, since receivers refuse a nonce they have seen.
        """
        if not self.enabled:
            return {}
        if len(body_sha256) != _DIGEST_BYTES:
            raise ValueError(
                f"body_sha256 must be a {_DIGEST_BYTES}-byte SHA-256 digest, "
                f"got {len(body_sha256)} bytes"
            )
        timestamp = str(int(self._clock()))
        nonce = secrets.token_hex(16)
        signature = self._mac(_digest_parts(context, timestamp, nonce, body_sha256))
        return {TIMESTAMP_HEADER: timestamp, NONCE_HEADER: nonce, SIGNATURE_HEADER: signature}

    def verify(self, context: str, body: bytes, headers: Mapping[str, str]) -> None:
        """Accept an authentic, fresh, first-seen message or raise AuthError; no-op when off."""
        if not self.enabled:
            return
        shown, timestamp, nonce = self._authentic(context, body, headers)
        ts = int(timestamp)
        self._check_fresh(shown, ts)
        self._remember(shown, nonce, ts)

    def verify_echo(
        self, context: str, body: bytes, headers: Mapping[str, str], *, sent: str, echoed: str
    ) -> None:
        """Accept an authentic answer that echoes ``sent``, the nonce of the request this node
        just made, whatever its timestamp; AuthError otherwise, no-op when off.

        Challenge-response instead of a clock: only a holder of the secret can sign an answer
        naming a nonce that did not exist before the request (docs/readiness.md#clocks). It is
        for a refusal that carries the answering node's clock, so nothing is remembered.
        """
        if not self.enabled:
            return
        shown, _, _ = self._authentic(context, body, headers)
        if not hmac.compare_digest(sent.encode(), echoed.encode()):
            raise AuthError(
                f"rejected {shown}: it echoes another request's nonce", reason="replayed"
            )

    def _authentic(
        self, context: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[str, str, str]:
        """(context as shown, timestamp, nonce) of a well-formed, authentic message."""
        shown = context if context.isprintable() else ascii(context)
        found = _pick_headers(shown, headers)
        timestamp, nonce, signature = (found[name] for name in _HEADERS)
        _check_formats(shown, timestamp, nonce, signature)
        self._check_mac(shown, _message_parts(context, timestamp, nonce, body), signature)
        return shown, timestamp, nonce

    def sign_fields(self, fields: Mapping[str, str]) -> dict[str, str]:
        """``fields`` plus "ts", "nonce" and "sig"; ``fields`` unchanged when auth is off."""
        reserved = sorted(set(fields) & set(FIELD_KEYS))
        if reserved:
            raise ValueError(f"field names {', '.join(reserved)} are reserved for the signature")
        if not self.enabled:
            return dict(fields)
        signed = dict(fields, ts=str(int(self._clock())), nonce=secrets.token_hex(16))
        signed["sig"] = self._mac(_field_parts(signed))
        return signed

    def verify_fields(self, fields: Mapping[str, str]) -> None:
        """Accept authentic, fresh signed fields (repeats included) or raise AuthError."""
        if not self.enabled:
            return
        context = "announcement"
        missing = [key for key in FIELD_KEYS if key not in fields]
        if missing:
            raise AuthError(
                f"unsigned announcement: no {', '.join(missing)} field; {_REMEDY}",
                reason="unsigned",
            )
        _check_formats(context, fields["ts"], fields["nonce"], fields["sig"])
        unsigned = {key: value for key, value in fields.items() if key != "sig"}
        self._check_mac(context, _field_parts(unsigned), fields["sig"])
        self._check_fresh(context, int(fields["ts"]))

    def probe_mac(self, session: str, nonce: str, rank: int, host: str) -> str:
        """A probe listener's answer to ``nonce``: bound to the session, keyed by the token.

        Without a token anyone who knows the session can compute it (it proves "a sidecar of
        this session answered", not who); with one, only holders of the secret can.
        """
        return self._mac([_PROBE_TAG, _utf8(session), _utf8(nonce), b"%d" % rank, _utf8(host)])

    def data_mac(self, session: str, nonce: str, up: int, down: int) -> str:
        """A prober's request to move ``up`` and ``down`` bytes on the probe of ``nonce``.

        Keyed by the token, so that with one set a stranger cannot make a window send data.
        """
        return self._mac([_DATA_TAG, _utf8(session), _utf8(nonce), b"%d" % up, b"%d" % down])

    def local_proof(self) -> str:
        """What `rallypoint run` sends with a write to its own sidecar's local API.

        The token's MAC over a fixed tag: the secret itself never crosses the socket, and a
        local user without the token cannot make one (docs/api.md, "Writes").
        """
        return self._mac([_LOCAL_TAG])

    def check_local(self, authorization: str | None) -> None:
        """Accept a local write that proves the token (AuthError if not); no-op when off."""
        if not self.enabled:
            return
        scheme, _, proof = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not proof:
            raise AuthError(
                "this sidecar has a session token: a write needs it (`rallypoint run` sends"
                " it from RALLYPOINT_TOKEN or --token-file, the sidecar's own)",
                reason="unsigned",
            )
        if not hmac.compare_digest(self.local_proof(), proof.strip()):
            raise AuthError(
                "the write's token is not this sidecar's: give `rallypoint run` the same"
                " RALLYPOINT_TOKEN (or --token-file) as the sidecar",
                reason="bad_signature",
            )

    def _mac(self, parts: list[bytes]) -> str:
        return hmac.new(self._key, _frame(parts), hashlib.sha256).hexdigest()

    def _check_mac(self, context: str, parts: list[bytes], signature: str) -> None:
        if not hmac.compare_digest(self._mac(parts), signature):
            raise AuthError(f"rejected {context}: bad signature; {_REMEDY}", reason="bad_signature")

    def _check_fresh(self, context: str, ts: int) -> None:
        skew = self._clock() - ts
        if abs(skew) > self.max_skew_s:
            direction = "behind" if skew > 0 else "ahead of"
            raise AuthError(
                f"rejected {context}: its timestamp is {abs(skew):.0f}s {direction} this "
                f"node's clock (limit {self.max_skew_s:g}s); synchronise the clocks (NTP)",
                reason="stale",
                skew_s=-skew,
            )

    def _remember(self, context: str, nonce: str, ts: int) -> None:
        if ts <= self._horizon:
            raise AuthError(
                f"rejected {context}: too old for the replay cache after heavy traffic; "
                "the sender should retry with a fresh message",
                reason="stale",
            )
        if nonce in self._seen:
            raise AuthError(
                f"rejected {context}: replayed message (nonce seen before)", reason="replayed"
            )
        now = self._clock()
        # Nonces whose message would now be stale cannot be replayed: forget them.
        while self._seen:
            oldest_nonce, oldest_ts = next(iter(self._seen.items()))
            if now - oldest_ts <= self.max_skew_s and len(self._seen) < self.nonce_cache_size:
                break
            del self._seen[oldest_nonce]
            if now - oldest_ts <= self.max_skew_s:
                # Evicted while still fresh: refuse everything as old as it from now on.
                self._horizon = max(self._horizon, oldest_ts)
        self._seen[nonce] = ts


def _pick_headers(context: str, headers: Mapping[str, str]) -> dict[str, str]:
    """The three signature headers, looked up case-insensitively; each must appear once."""
    wanted = {name.lower(): name for name in _HEADERS}
    found: dict[str, str] = {}
    for key, value in headers.items():
        name = wanted.get(key.lower())
        if name is None:
            continue
        if name in found:
            raise AuthError(f"rejected {context}: header {name} appears twice", reason="malformed")
        found[name] = value
    missing = [name for name in _HEADERS if name not in found]
    if missing:
        raise AuthError(
            f"unsigned {context}: no {', '.join(missing)} header; {_REMEDY}", reason="unsigned"
        )
    return found


def _check_formats(context: str, timestamp: str, nonce: str, signature: str) -> None:
    for what, value, pattern in (
        ("timestamp", timestamp, _TIMESTAMP),
        ("nonce", nonce, _NONCE),
        ("signature", signature, _SIGNATURE),
    ):
        if pattern.fullmatch(value) is None:
            raise AuthError(f"rejected {context}: malformed {what}", reason="malformed")


def _message_parts(context: str, timestamp: str, nonce: str, body: bytes) -> list[bytes]:
    return _digest_parts(context, timestamp, nonce, hashlib.sha256(body).digest())


def _digest_parts(context: str, timestamp: str, nonce: str, body_sha256: bytes) -> list[bytes]:
    return [_MESSAGE_TAG, _utf8(context), timestamp.encode(), nonce.encode(), body_sha256]


def _field_parts(fields: Mapping[str, str]) -> list[bytes]:
    parts = [_FIELDS_TAG]
    for key, value in sorted(fields.items()):
        parts += [_utf8(key), _utf8(value)]
    return parts


def _utf8(text: str) -> bytes:
    # surrogatepass: a path with a lone surrogate still gets a (failing) MAC, not a crash.
    return text.encode("utf-8", "surrogatepass")


def _frame(parts: list[bytes]) -> bytes:
    """Each part prefixed with its 4-byte big-endian length: an unambiguous encoding."""
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)
