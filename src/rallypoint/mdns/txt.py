"""An announcement on the wire, purely: DNS-SD names, TXT fields and their validation."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Mapping, Sequence

import msgspec

from rallypoint.core import names
from rallypoint.errors import PeerMessageError

#: The DNS-SD service type every rallypoint node announces (RFC 6763 section 7).
SERVICE_TYPE = "_rallypoint._tcp.local."

#: Version of the TXT layout; announcements with another version are dropped.
TXT_VERSION = "1"

# RFC 6763 §6.1: one TXT string is at most 255 bytes; §6.2 suggests keeping the whole
# record small. Anything larger than this is not ours and is dropped unread.
MAX_TXT_BYTES = 1300
MAX_TXT_KEYS = 16
MAX_VALUE_BYTES = 255
MAX_SESSION_CHARS = 128
MAX_GENERATION_CHARS = 64
MAX_RANK = 1_000_000
# RFC 6763 §4.1.1: an instance name is one DNS label, at most 63 bytes.
MAX_INSTANCE_BYTES = 63

# Keys we write; the signature fields (added by auth.sign_fields) travel beside them.
K_VERSION, K_SESSION, K_HOST = "v", "session", "host"
K_RANK, K_PORT, K_GENERATION, K_ADDRS = "rank", "port", "gen", "addrs"
REQUIRED_KEYS = (K_VERSION, K_SESSION, K_HOST, K_RANK, K_PORT, K_GENERATION)

_SESSION = re.compile(r"[A-Za-z0-9._:@/+=-]+")
_GENERATION = re.compile(r"[A-Za-z0-9._:-]*")
_INT = re.compile(r"-?[0-9]{1,7}")
_UNSAFE_INSTANCE = re.compile(r"[^A-Za-z0-9-]+")


class Announcement(msgspec.Struct, frozen=True):
    """One node's mDNS announcement, validated; rank -1 means "not assigned yet"."""

    session: str
    host: str
    rank: int
    peer_port: int
    generation: str
    addresses: tuple[str, ...]
    instance: str
    #: Signature check result: True/False when a token was given to check it, else None.
    verified: bool | None = None


def instance_name(session: str, host: str) -> str:
    """This node's stable DNS-SD instance label: "<session>-<host>", shortened with a hash."""
    full = _UNSAFE_INSTANCE.sub("-", f"{session}-{host}").strip("-") or "rallypoint"
    if len(full) <= MAX_INSTANCE_BYTES:
        return full
    # Keep the name stable and unique across restarts: a prefix plus a digest of the whole.
    digest = hashlib.sha256(f"{session}\0{host}".encode()).hexdigest()[:10]
    return f"{full[: MAX_INSTANCE_BYTES - 11].rstrip('-')}-{digest}"


def instance_label(name: str) -> str:
    """The instance label of a full service name ("label._rallypoint._tcp.local.")."""
    return name[: -len(SERVICE_TYPE) - 1] if name.endswith("." + SERVICE_TYPE) else name


def encode_fields(
    *, session: str, host: str, rank: int, peer_port: int, generation: str, addresses: Sequence[str]
) -> tuple[dict[str, str], Announcement]:
    """TXT fields announcing this node and the announcement peers will parse from them.

    Addresses that do not fit in one 255-byte TXT string are left out (kept in order).
    PeerMessageError when a value breaks the rules peers apply.
    """
    fields = {
        K_VERSION: TXT_VERSION,
        K_SESSION: session,
        K_HOST: host,
        K_RANK: str(rank),
        K_PORT: str(peer_port),
        K_GENERATION: generation,
    }
    kept: list[str] = []
    for address in addresses:
        # The whole "addrs=a,b" string must stay one TXT string (RFC 6763 §6.1).
        if len(f"{K_ADDRS}={','.join([*kept, address])}".encode()) > MAX_VALUE_BYTES:
            break
        kept.append(address)
    fields[K_ADDRS] = ",".join(kept)
    # Validate our own output with the same rules peers apply, so a bad setting fails here.
    encoded = {key.encode(): value.encode() for key, value in fields.items()}
    return fields, parse_fields(encoded, instance=instance_name(session, host))[0]


def decode_txt(properties: Mapping[bytes, bytes | None]) -> dict[str, str]:
    """TXT properties as text; PeerMessageError on non-UTF-8, valueless keys or oversize records."""
    if len(properties) > MAX_TXT_KEYS:
        raise PeerMessageError(f"announcement has {len(properties)} TXT keys, limit {MAX_TXT_KEYS}")
    fields: dict[str, str] = {}
    total = 0
    for raw_key, raw_value in properties.items():
        if not isinstance(raw_key, bytes) or not isinstance(raw_value, bytes):
            raise PeerMessageError(f"announcement TXT key {raw_key!r} has no value")
        total += len(raw_key) + len(raw_value) + 2
        if len(raw_value) > MAX_VALUE_BYTES or total > MAX_TXT_BYTES:
            raise PeerMessageError("announcement TXT record is oversized")
        try:
            fields[raw_key.decode("utf-8")] = raw_value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PeerMessageError(f"announcement TXT key {raw_key!r} is not UTF-8") from exc
    return fields


def _int_field(fields: Mapping[str, str], key: str, low: int, high: int) -> int:
    text = fields[key]
    if not _INT.fullmatch(text) or not low <= int(text) <= high:
        raise PeerMessageError(
            f"announcement {key}={text[:40]!r} is not an integer in [{low}, {high}]"
        )
    return int(text)


def _addresses(text: str) -> tuple[str, ...]:
    if not text:
        return ()
    result: list[str] = []
    for item in text.split(","):
        try:
            result.append(str(ipaddress.ip_address(item)))
        except ValueError as exc:
            raise PeerMessageError(f"announcement address {item[:60]!r} is not an IP") from exc
    return tuple(dict.fromkeys(result))


def parse_fields(
    properties: Mapping[bytes, bytes | None], *, instance: str
) -> tuple[Announcement, dict[str, str]]:
    """Validate an announcement's TXT properties; PeerMessageError names the field at fault."""
    fields = decode_txt(properties)
    missing = [key for key in REQUIRED_KEYS if key not in fields]
    if missing:
        raise PeerMessageError(f"announcement {instance!r} lacks TXT keys {missing}")
    if fields[K_VERSION] != TXT_VERSION:
        raise PeerMessageError(f"announcement v={fields[K_VERSION][:20]!r}, expected {TXT_VERSION}")
    session = fields[K_SESSION]
    if len(session) > MAX_SESSION_CHARS or not _SESSION.fullmatch(session):
        raise PeerMessageError(f"announcement session={session[:40]!r} is not a session id")
    host = fields[K_HOST]
    if names.host_problem(host, ip=True) is not None:
        raise PeerMessageError(f"announcement host={host[:60]!r} is not an RFC 1123 host name")
    generation = fields[K_GENERATION]
    if len(generation) > MAX_GENERATION_CHARS or not _GENERATION.fullmatch(generation):
        raise PeerMessageError(f"announcement gen={generation[:40]!r} is not a generation")
    announcement = Announcement(
        session=session,
        host=host,
        rank=_int_field(fields, K_RANK, -1, MAX_RANK),
        peer_port=_int_field(fields, K_PORT, 1, 65535),
        generation=generation,
        addresses=_addresses(fields.get(K_ADDRS, "")),
        instance=instance,
    )
    return announcement, fields
