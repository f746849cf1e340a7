"""Pure validators for the fields every peer message shares: tokens, hosts, numbers, reasons.

Each takes an untrusted JSON value and the field's name, and returns it checked (and in
canonical form) or raises PeerMessageError naming the field.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re

import msgspec

from rallypoint.core import names
from rallypoint.errors import PeerMessageError
from rallypoint.reasons import Reason

#: Largest cluster a document may describe.
MAX_NODES = 65536
#: Generations, epochs and interface names.
TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_SESSION = re.compile(r"[\x21-\x7e]{1,256}")
# Dotted-quad IPv4 already in canonical form (no leading zeros): ipaddress would return it
# unchanged, so the fast path skips it (it was a tenth of the master's CPU in a join herd).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
_CODE = re.compile(r"[a-z_]{1,40}")


def generation(value: object, name: str = "after") -> str:
    """A generation or epoch token: 1-64 characters of [A-Za-z0-9._:-]."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise PeerMessageError(f"{name} must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    return value


def host_name(value: object, name: str = "host") -> str:
    """A host name or a canonical IP literal, by names.host_problem's lenient rule for peers."""
    if isinstance(value, str) and names.host_problem(value, ip=True, lenient=True) is None:
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            return value
    raise PeerMessageError(f"{name} must be a host name or an IP address, got {value!r:.80}")


def address(value: object, name: str = "address") -> str:
    """An IPv4 or IPv6 address in canonical form (so expected/actual compare as strings)."""
    if isinstance(value, str):
        if _CANONICAL_IPV4.fullmatch(value):
            return value
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise PeerMessageError(f"{name} must be an IP address, got {value!r:.80}")


def reasons(value: object, where: str, most: int) -> tuple[Reason, ...]:
    """A list of at most ``most`` reasons (the failures a report or verdict carries)."""
    if not isinstance(value, list) or len(value) > most:
        raise PeerMessageError(f"{where}: failures must be a list of at most {most}")
    out = []
    for index, raw in enumerate(value):
        name = f"{where}: failures[{index}]"
        if not isinstance(raw, dict):
            raise PeerMessageError(f"{name} is not an object")
        code, message = raw.get("code"), raw.get("message")
        if not isinstance(code, str) or not _CODE.fullmatch(code):
            raise PeerMessageError(f"{name}.code must be a reason code")
        if not isinstance(message, str) or not 0 < len(message) <= 1000:
            raise PeerMessageError(f"{name}.message must be a string of 1-1000 characters")
        host, detail, ranks = raw.get("host"), raw.get("detail"), raw.get("ranks", [])
        if detail is not None and (not isinstance(detail, str) or len(detail) > 1000):
            raise PeerMessageError(f"{name}.detail must be a string of at most 1000 characters")
        if not isinstance(ranks, list) or len(ranks) > 2:
            raise PeerMessageError(f"{name}.ranks must list at most two ranks")
        out.append(
            Reason(
                code=code,
                message=message,
                host=None if host is None else host_name(host, f"{name}.host"),
                detail=detail,
                ranks=tuple(integer(r, f"{name}.ranks[]", 0, MAX_NODES - 1) for r in ranks),
            )
        )
    return tuple(out)


def boolean(value: object, name: str) -> bool:
    """A JSON true or false."""
    if not isinstance(value, bool):
        raise PeerMessageError(f"{name} must be true or false")
    return value


def session(value: object, name: str) -> str:
    """A session name: 1-256 printable ASCII characters."""
    if not isinstance(value, str) or not _SESSION.fullmatch(value):
        raise PeerMessageError(f"{name} must be 1-256 printable ASCII characters")
    return value


def number(value: object, name: str, low: float, high: float) -> float:
    """A finite JSON number in low..high (NaN and Infinity, which json.loads takes, are not)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        # An int may be too large for a float (math.isfinite would raise): compare it as is.
        or (isinstance(value, float) and not math.isfinite(value))
        or not low <= value <= high
    ):
        raise PeerMessageError(f"{name} must be a number in {low:g}-{high:g}, got {value!r:.40}")
    return float(value)


def integer(value: object, name: str, low: int, high: int) -> int:
    """An integer in low..high; a JSON true is not one."""
    # bool is an int subclass; true is not a rank.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PeerMessageError(f"{name} must be an integer in {low}-{high}, got {value!r:.40}")
    return value


def load(body: bytes, limit: int, what: str) -> dict[str, object]:
    """The JSON object in ``body``, at most ``limit`` bytes; ``what`` names the message.

    Read by json.loads, which takes NaN and Infinity, so that ``number`` refuses them naming
    the field; msgspec writes what peers send (``dump``), the rules here read it back.
    """
    if len(body) > limit:
        raise PeerMessageError(f"{what}: {len(body)} bytes is over the limit of {limit}")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PeerMessageError(f"{what}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise PeerMessageError(f"{what}: expected a JSON object")
    return data


def dump(message: object) -> bytes:
    """A message struct (or a JSON object) as compact JSON, its fields and keys sorted.

    The peer messages are msgspec Structs whose fields are their wire form; signatures cover
    these exact bytes. Sets are written sorted, so equal messages are equal bytes.
    """
    return _ENCODER.encode(message)


_ENCODER = msgspec.json.Encoder(order="sorted")
