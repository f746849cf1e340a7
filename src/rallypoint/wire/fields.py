"""Pure: reading a peer's message into its struct, and the rules msgspec cannot declare.

``load`` decodes a body into its message struct with msgspec, which checks every field's
type and the bounds its struct declares (model.py's Rank, Port, Token ...), and turns any
fault into a PeerMessageError naming the message and the field's path. What a type cannot
say is checked after decoding: host names (``host_name``) and addresses (``address``, also
canonical so that expected and actual compare as strings), and each message's cross-field
rules (in its own module).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from rallypoint.core import names
from rallypoint.errors import PeerMessageError
from rallypoint.model import MAX_NODES, PATTERN_WORDS, TOKEN_CHARS, TOKEN_WORDS
from rallypoint.reasons import Reason

__all__ = ["MAX_NODES", "TOKEN", "address", "dump", "generation", "host_name", "load"]

T = TypeVar("T")

#: Generations, epochs and interface names (model.Token), for query strings.
TOKEN = re.compile(TOKEN_CHARS)


def load(body: bytes, kind: type[T], limit: int, what: str) -> T:
    """The ``kind`` in ``body``, at most ``limit`` bytes; ``what`` names the message.

    Fields absent from the body take their struct's defaults; fields a struct does not
    name are ignored, so a newer peer's additions do not break an older one.
    """
    if len(body) > limit:
        raise PeerMessageError(f"{what}: {len(body)} bytes is over the limit of {limit}")
    try:
        value: T = _decoder(kind).decode(body)  # type: ignore[arg-type]
    except msgspec.ValidationError as exc:
        raise PeerMessageError(f"{what}: {in_words(str(exc))}") from exc
    except msgspec.DecodeError as exc:
        raise PeerMessageError(f"{what}: not JSON ({exc})") from exc
    except RecursionError as exc:  # msgspec skips a field it does not know by recursing
        raise PeerMessageError(f"{what}: not JSON (nested too deeply)") from exc
    return value


def in_words(message: str) -> str:
    """msgspec's message with each pattern it quotes said in words (model.text)."""
    for pattern, words in PATTERN_WORDS.items():
        message = message.replace(f"`str` matching regex {pattern!r}", words)
    return message


@functools.cache
def _decoder(kind: Any) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(kind)


def dump(message: object) -> bytes:
    """A message struct (or a JSON object) as compact JSON, its fields and keys sorted.

    The peer messages are msgspec Structs whose fields are their wire form; signatures cover
    these exact bytes. Sets are written sorted, so equal messages are equal bytes.
    """
    return _ENCODER.encode(message)


_ENCODER = msgspec.json.Encoder(order="sorted")


def generation(value: object, name: str = "after") -> str:
    """A generation or epoch token from a query string (model.Token)."""
    if not isinstance(value, str) or not TOKEN.fullmatch(value):
        raise PeerMessageError(f"{name} must be {TOKEN_WORDS}")
    return value


def host_name(value: object, name: str = "host") -> str:
    """A host name or a canonical IP literal, by names.host_problem's lenient rule for peers."""
    if isinstance(value, str) and names.host_problem(value, ip=True, lenient=True) is None:
        # A name or an IPv4 literal is already canonical (ipaddress takes no other spelling of
        # IPv4); an IPv6 literal (a name has no colon, host_problem refused zone ids) is not.
        return str(ipaddress.ip_address(value)) if ":" in value else value
    raise PeerMessageError(f"{name} must be a host name or an IP address, got {value!r:.80}")


def address(value: object, name: str = "address") -> str:
    """An IPv4 or IPv6 address in canonical form (so expected/actual compare as strings)."""
    if isinstance(value, str):
        # IPv4 has one spelling, returned as it is: ipaddress would return it unchanged (it
        # was a tenth of the master's CPU in a join herd).
        if names.IPV4.fullmatch(value):
            return value
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
    raise PeerMessageError(f"{name} must be an IP address, got {value!r:.80}")


def addresses(values: Iterable[str], where: str) -> tuple[str, ...]:
    """Addresses in canonical form, each once, in their order."""
    return tuple(
        dict.fromkeys(address(a, f"{where}: addresses[{i}]") for i, a in enumerate(values))
    )


def reasons(values: tuple[Reason, ...], where: str) -> tuple[Reason, ...]:
    """Decoded reasons with their hosts checked (the only field their struct cannot bound)."""
    return tuple(
        reason
        if reason.host is None
        else msgspec.structs.replace(
            reason, host=host_name(reason.host, f"{where}: failures[{index}].host")
        )
        for index, reason in enumerate(values)
    )
