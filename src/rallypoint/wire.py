"""Pure peer-message codec: join bodies, join answers, pokes and cluster documents.

Everything a peer sends is untrusted input. Each parser checks the size first, then the
JSON shape, then every field, and returns a frozen value or raises PeerMessageError naming
the field at fault; it never returns a half-validated value.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterDoc, Member

#: Largest join or poke body accepted (a join carries at most MAX_ADDRESSES addresses).
MAX_JOIN_BYTES = 16 * 1024
#: Largest cluster document accepted: about 4096 nodes with a few addresses each.
MAX_DOC_BYTES = 8 * 1024 * 1024
#: Largest number of addresses one node may report.
MAX_ADDRESSES = 64
#: Largest cluster a document may describe.
MAX_NODES = 65536

_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_SESSION = re.compile(r"[\x21-\x7e]{1,256}")
# RFC 1123 labels; underscores are tolerated because container runtimes hand them out.
_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*\.?")
# Dotted-quad IPv4 already in canonical form (no leading zeros): ipaddress would return it
# unchanged, so the fast path skips it (it was a tenth of the master's CPU in a join herd).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_CANONICAL_IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


@dataclass(frozen=True, slots=True)
class JoinRequest:
    """A worker's POST /v1/join: who it is and what it reserved."""

    session: str
    member: Member
    #: The generation the worker acted on last, if any (for diagnostics on the master).
    generation_seen: str | None = None


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    """The master's answer to a join: its epoch (new on every master start) and progress."""

    session: str
    epoch: str
    generation: str | None
    joined: int
    nnodes: int


@dataclass(frozen=True, slots=True)
class Poke:
    """The master's POST /v1/poke: "I (re)started or changed; re-join now"."""

    session: str
    epoch: str


def encode_join(request: JoinRequest) -> bytes:
    """The JSON body of a join request."""
    member = request.member
    return _dump(
        {
            "session": request.session,
            "rank": member.rank,
            "host": member.host,
            "addresses": list(member.addresses),
            "tf_port": member.tf_port,
            "jax_port": member.jax_port,
            "generation_seen": request.generation_seen,
        }
    )


def parse_join(body: bytes) -> JoinRequest:
    """Validate a join body; PeerMessageError names the field at fault."""
    data = _load(body, MAX_JOIN_BYTES, "join request")
    seen = data.get("generation_seen")
    return JoinRequest(
        session=_session(data.get("session"), "session"),
        member=_member(data, "join request"),
        generation_seen=None if seen is None else generation(seen, "generation_seen"),
    )


def encode_join_answer(answer: JoinAnswer) -> bytes:
    """The JSON body of the master's join answer."""
    return _dump(
        {
            "session": answer.session,
            "epoch": answer.epoch,
            "generation": answer.generation,
            "joined": answer.joined,
            "nnodes": answer.nnodes,
        }
    )


def parse_join_answer(body: bytes) -> JoinAnswer:
    """Validate the master's join answer."""
    data = _load(body, MAX_JOIN_BYTES, "join answer")
    gen = data.get("generation")
    nnodes = _int(data.get("nnodes"), "nnodes", 1, MAX_NODES)
    return JoinAnswer(
        session=_session(data.get("session"), "session"),
        epoch=generation(data.get("epoch"), "epoch"),
        generation=None if gen is None else generation(gen, "generation"),
        joined=_int(data.get("joined"), "joined", 0, nnodes),
        nnodes=nnodes,
    )


def encode_poke(poke: Poke) -> bytes:
    """The JSON body of a poke."""
    return _dump({"session": poke.session, "epoch": poke.epoch})


def parse_poke(body: bytes) -> Poke:
    """Validate a poke body."""
    data = _load(body, MAX_JOIN_BYTES, "poke")
    return Poke(
        session=_session(data.get("session"), "session"),
        epoch=generation(data.get("epoch"), "epoch"),
    )


def encode_cluster_doc(doc: ClusterDoc) -> bytes:
    """The JSON body of GET /v1/cluster."""
    return _dump(
        {
            "session": doc.session,
            "generation": doc.generation,
            "master_host": doc.master_host,
            "master_port": doc.master_port,
            "members": [
                {
                    "rank": m.rank,
                    "host": m.host,
                    "addresses": list(m.addresses),
                    "tf_port": m.tf_port,
                    "jax_port": m.jax_port,
                }
                for m in doc.members
            ],
        }
    )


def parse_cluster_doc(body: bytes) -> ClusterDoc:
    """Validate a cluster document: ranks 0..N-1 in order, unique hosts, master is rank 0."""
    data = _load(body, MAX_DOC_BYTES, "cluster document")
    raw_members = data.get("members")
    if not isinstance(raw_members, list) or not 1 <= len(raw_members) <= MAX_NODES:
        raise PeerMessageError(f"cluster document: members must be a list of 1-{MAX_NODES} nodes")
    members: list[Member] = []
    for index, raw in enumerate(raw_members):
        if not isinstance(raw, dict):
            raise PeerMessageError(f"cluster document: members[{index}] is not an object")
        member = _member(raw, f"members[{index}]")
        if member.rank != index:
            raise PeerMessageError(
                f"cluster document: members[{index}] has rank {member.rank}, expected {index}"
            )
        members.append(member)
    hosts = [m.host.lower() for m in members]
    if len(set(hosts)) != len(hosts):
        raise PeerMessageError("cluster document: a host appears twice in members")
    master_host = host_name(data.get("master_host"), "master_host")
    if master_host != members[0].host:
        raise PeerMessageError(
            f"cluster document: master_host {master_host!r} is not members[0].host "
            f"{members[0].host!r}"
        )
    return ClusterDoc(
        session=_session(data.get("session"), "session"),
        generation=generation(data.get("generation"), "generation"),
        master_host=master_host,
        master_port=_int(data.get("master_port"), "master_port", 1, 65535),
        members=tuple(members),
    )


def generation(value: object, name: str = "after") -> str:
    """A generation or epoch token: 1-64 characters of [A-Za-z0-9._:-]."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value):
        raise PeerMessageError(f"{name} must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    return value


def host_name(value: object, name: str = "host") -> str:
    """A host name (RFC 1123, underscores tolerated) or an IP literal."""
    if isinstance(value, str):
        if _HOSTNAME.fullmatch(value):
            return value
        try:
            return str(ipaddress.ip_address(value))
        except ValueError:
            pass
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


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value names gzip without refusing it (q=0)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def _member(data: Mapping[str, object], where: str) -> Member:
    raw_addresses = data.get("addresses")
    if not isinstance(raw_addresses, list) or len(raw_addresses) > MAX_ADDRESSES:
        raise PeerMessageError(f"{where}: addresses must be a list of at most {MAX_ADDRESSES}")
    addresses = tuple(address(a, f"{where}: addresses[{i}]") for i, a in enumerate(raw_addresses))
    tf_port = data.get("tf_port")
    jax_port = data.get("jax_port")
    return Member(
        rank=_int(data.get("rank"), f"{where}: rank", 0, MAX_NODES - 1),
        host=host_name(data.get("host"), f"{where}: host"),
        addresses=tuple(dict.fromkeys(addresses)),
        tf_port=None if tf_port is None else _int(tf_port, f"{where}: tf_port", 1, 65535),
        jax_port=None if jax_port is None else _int(jax_port, f"{where}: jax_port", 1, 65535),
    )


def _session(value: object, name: str) -> str:
    if not isinstance(value, str) or not _SESSION.fullmatch(value):
        raise PeerMessageError(f"{name} must be 1-256 printable ASCII characters")
    return value


def _int(value: object, name: str, low: int, high: int) -> int:
    # bool is an int subclass; true is not a rank.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise PeerMessageError(f"{name} must be an integer in {low}-{high}, got {value!r:.40}")
    return value


def _load(body: bytes, limit: int, what: str) -> dict[str, object]:
    if len(body) > limit:
        raise PeerMessageError(f"{what}: {len(body)} bytes is over the limit of {limit}")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PeerMessageError(f"{what}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise PeerMessageError(f"{what}: expected a JSON object")
    return data


def _dump(data: Mapping[str, object]) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()
