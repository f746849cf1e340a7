"""Names and their verdicts, pure: host-name rules, address classes, lookup answers, scope, judging.

Loopback policy: a name is LOOPBACK when *any* of its addresses is loopback, not only the
first. getaddrinfo sorts answers by RFC 6724, so the loopback one may well be what connect()
tries first, and a client that walks the list connects to itself before it reaches the real
address. A LOOPBACK peer name is fatal unless loopback is accepted (single-node and demo runs,
where every node shares this host); this node's own name is judged by :func:`judge_own`
(see docs/loopback.md). net/resolve.py does the lookups; everything decided about them is here.
"""

from __future__ import annotations

import contextlib
import enum
import ipaddress
import random
import re
from collections.abc import Collection, Iterable, Sequence

import msgspec

from rallypoint.core.links import measured_peers
from rallypoint.reasons import Reason

#: Sessions up to this many nodes verify every name under scope "auto".
AUTO_ALL_MAX_NODES = 64

SCOPES = ("auto", "all", "master")

# RFC 1123 2.1 labels: 1-63 letters, digits and inner hyphens. Peer messages also tolerate
# underscores, because container runtimes hand them out.
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
_LENIENT_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
# Labels that inet_aton() would read as a number: getaddrinfo("123") is 0.0.0.123.
_NUMERIC_LABEL = re.compile(r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)")
# IPv4 as ipaddress reads it: four decimal octets 0-255, no leading zeros.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")
# RFC 1035 2.3.4: 255 octets on the wire, which is 253 characters without the root dot.
_MAX_NAME_CHARS = 253


# -- host names -------------------------------------------------------------------------


class HostProblem(enum.StrEnum):
    """Why a string is not a usable host name (callers word the remedy for their input)."""

    EMPTY = "empty"
    TRAILING_DOT = "trailing_dot"
    TOO_LONG = "too_long"
    BAD_LABEL = "bad_label"
    NUMERIC = "numeric"
    ZONE_ID = "zone_id"


def host_problem(host: str, *, ip: bool = False, lenient: bool = False) -> HostProblem | None:
    """Why ``host`` is not an RFC 1123 host name (or with ``ip`` a bare IP literal); None if it is.

    Names whose every label inet_aton() reads as a number ("123", "10.0.0.256", "0x7f.1") are
    refused: resolvers take them for addresses. An IPv6 zone id names a different link on
    every host. ``lenient`` is for names in peer messages: underscores and one trailing dot pass.
    """
    if ip and IPV4.fullmatch(host):  # ipaddress takes IPv4 in this one spelling only
        return None
    if ip and ":" in host:  # only IPv6 has a colon: no ValueError raised for every name
        with contextlib.suppress(ValueError):
            ipaddress.ip_address(host)
            return HostProblem.ZONE_ID if "%" in host else None
    if lenient and host.endswith("."):
        host = host[:-1]
    if not host:
        return HostProblem.EMPTY
    if host.endswith("."):
        return HostProblem.TRAILING_DOT
    if len(host) > _MAX_NAME_CHARS:
        return HostProblem.TOO_LONG
    labels = host.split(".")
    label = _LENIENT_LABEL if lenient else _LABEL
    if not all(label.fullmatch(part) for part in labels):
        return HostProblem.BAD_LABEL
    if all(_NUMERIC_LABEL.fullmatch(part) for part in labels):
        return HostProblem.NUMERIC
    return None


# -- addresses --------------------------------------------------------------------------


def strip_scope(address: str) -> str:
    """The address without an IPv6 zone index ("fe80::1%eth0" -> "fe80::1")."""
    return address.split("%", 1)[0]


def is_loopback(address: str) -> bool:
    """True for 127/8, ::1, ::ffff:127.0.0.0/104, 0.0.0.0 and ::; ValueError if not an IP."""
    ip = ipaddress.ip_address(strip_scope(address))
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def canonical(address: str) -> str:
    """One spelling per address: compressed IPv6, IPv4-mapped IPv6 as IPv4, no zone index."""
    try:
        ip = ipaddress.ip_address(strip_scope(address))
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


# -- lookup answers ---------------------------------------------------------------------


class Verdict(enum.StrEnum):
    """How a name resolved."""

    OK = "ok"
    LOOPBACK = "loopback"
    NOT_FOUND = "not_found"
    TIMED_OUT = "timed_out"
    MISMATCH = "mismatch"


class Resolution(msgspec.Struct, frozen=True):
    """The outcome of checking one name: verdict, addresses and a one-line explanation."""

    host: str
    verdict: Verdict
    addresses: tuple[str, ...]
    detail: str
    attempts: int
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


def classify(
    host: str, found: Iterable[str], expected: Collection[str] | None, *, elapsed_s: float
) -> Resolution:
    """The verdict on one lookup's answer ``found``.

    ``expected`` holds the addresses the peer reported for itself; when it is given and not
    empty, an answer with none of them is a MISMATCH.
    """
    addresses = tuple(dict.fromkeys(found))

    def done(verdict: Verdict, detail: str) -> Resolution:
        return Resolution(host, verdict, addresses, detail, 1, elapsed_s)

    if not addresses:
        return done(Verdict.NOT_FOUND, f"{host} resolves to no address")
    listing = ", ".join(addresses)
    if any(is_loopback(address) for address in addresses):
        remedy = "map the name to the node's cluster address in /etc/hosts or DNS"
        return done(Verdict.LOOPBACK, f"{loopback_fact(host, addresses)}; {remedy}")
    if expected:
        wanted = {canonical(address) for address in expected}
        if not any(canonical(address) in wanted for address in addresses):
            return done(
                Verdict.MISMATCH,
                f"{host} resolves to {listing}, none of the addresses the node reported "
                f"({', '.join(expected)}); fix the name's DNS or /etc/hosts entry",
            )
    return done(Verdict.OK, f"{host} resolves to {listing}")


def loopback_fact(host: str, addresses: Sequence[str]) -> str:
    """What a LOOPBACK answer says, without its remedy (for a verdict excused here)."""
    first = next(address for address in addresses if is_loopback(address))
    return f"{host} resolves to loopback {first} (answers: {', '.join(addresses)})"


def timed_out(host: str, timeout_s: float, *, elapsed_s: float) -> Resolution:
    """A lookup that gave no answer within ``timeout_s``."""
    detail = f"{host} did not resolve within {timeout_s:g}s"
    return Resolution(host, Verdict.TIMED_OUT, (), detail, 1, elapsed_s)


def not_found(host: str, why: str, *, elapsed_s: float) -> Resolution:
    """A lookup the resolver refused (socket.gaierror and the like), ``why`` in its words."""
    return Resolution(host, Verdict.NOT_FOUND, (), f"{host} does not resolve: {why}", 1, elapsed_s)


def no_attempt(host: str) -> Resolution:
    """The deadline passed before any lookup of ``host`` started."""
    detail = f"{host}: the deadline passed before a lookup"
    return Resolution(host, Verdict.TIMED_OUT, (), detail, 0, 0.0)


def with_loopback_accepted(res: Resolution, *, accept_loopback: bool) -> Resolution:
    """``res``, with a LOOPBACK answer counted as OK when loopback is accepted."""
    if accept_loopback and res.verdict is Verdict.LOOPBACK:
        detail = f"{res.detail} (accepted: all nodes share this host)"
        return msgspec.structs.replace(res, verdict=Verdict.OK, detail=detail)
    return res


# -- scope ------------------------------------------------------------------------------


def scope_ranks(
    nnodes: int, rank: int, scope: str, *, sample: int = 8, seed: str = ""
) -> list[int]:
    """The ranks whose names this node verifies, in ascending order, its own rank included.

    "all": every rank. "master": rank 0 and this rank. "auto": "all" up to
    AUTO_ALL_MAX_NODES nodes, else the master, this rank, its ring neighbours, the peers
    whose links it measures (links.measured_peers) and ``sample``
    other ranks drawn with a generator seeded by ``seed`` and the rank, so that every run of
    the same session checks the same names. The own rank is there for the self check
    (Debian's 127.0.1.1 line), which :func:`judge_own` judges.
    """
    if nnodes < 1:
        raise ValueError(f"nnodes must be at least 1, got {nnodes}")
    if not 0 <= rank < nnodes:
        raise ValueError(f"rank {rank} is out of range for {nnodes} nodes")
    if scope not in SCOPES:
        raise ValueError(f"resolve scope {scope!r} is not one of {', '.join(SCOPES)}")
    if sample < 0:
        raise ValueError(f"sample must not be negative, got {sample}")
    if scope == "all" or (scope == "auto" and nnodes <= AUTO_ALL_MAX_NODES):
        return list(range(nnodes))
    chosen = {0, rank}
    if scope == "master":
        return sorted(chosen)
    chosen |= {(rank - 1) % nnodes, (rank + 1) % nnodes}
    chosen |= set(measured_peers(nnodes, rank))  # the links whose throughput it measures
    others = [other for other in range(nnodes) if other not in chosen]
    # A str seed is hashed with SHA-512 by random.seed, so the draw is the same on every
    # platform and does not depend on PYTHONHASHSEED.
    rng = random.Random(f"{seed}:{rank}")
    chosen.update(rng.sample(others, min(sample, len(others))))
    return sorted(chosen)


# -- judging ----------------------------------------------------------------------------


def dials_self(res: Resolution, *, accept_loopback: bool) -> bool:
    """True when dialling ``res``'s addresses may reach this node itself, and that is not fine."""
    return res.verdict is Verdict.LOOPBACK and not accept_loopback


def peer_reason(res: Resolution, *, accept_loopback: bool) -> Reason | None:
    """Why a peer's resolution fails verification, or None when it passes."""
    if res.verdict is Verdict.OK:
        return None
    if res.verdict is Verdict.LOOPBACK:
        if not dials_self(res, accept_loopback=accept_loopback):
            return None
        return loopback_reason(res.host, res)
    if res.verdict is Verdict.MISMATCH:
        return Reason(
            "address_mismatch",
            f"peer {res.host} resolves here to an address it did not report; "
            "fix its DNS or /etc/hosts entry",
            host=res.host,
            detail=res.detail,
        )
    return Reason(
        "resolve_failed",
        f"peer {res.host} does not resolve here ({res.verdict}); wait for DNS or fix it",
        host=res.host,
        detail=res.detail,
    )


def master_reason(res: Resolution, *, accept_loopback: bool) -> Reason | None:
    """Why a worker cannot dial the master's resolved name, or None when it may try."""
    master = res.host
    if res.verdict in (Verdict.NOT_FOUND, Verdict.TIMED_OUT):
        return Reason(
            "resolve_failed",
            f"the master's name {master} does not resolve here; wait for DNS or fix it",
            host=master,
            detail=res.detail,
        )
    if dials_self(res, accept_loopback=accept_loopback):
        return loopback_reason(master, res)
    return None


class OwnNameRules(msgspec.Struct, frozen=True):
    """What the judgement of this node's own name takes from the settings, as plain values
    (Settings.own_name_rules): --strict-self, whether GLOO_SOCKET_IFNAME is served, JAX."""

    strict_self: bool = False
    emit_ifname: bool = True
    jax: bool = False


def judge_own(
    res: Resolution, rules: OwnNameRules, *, accept_loopback: bool, ifname: str | None
) -> tuple[Reason | None, str | None]:
    """This node's own name: (why it is not ready, or None; a warning for /status, or None).

    On loopback it is fatal (``self_loopback``) unless loopback is accepted or ``ifname`` names
    the interface gloo binds instead (GLOO_SOCKET_IFNAME); with --strict-self anything but OK
    is fatal (``strict_self``), ``ifname`` or not.
    """
    if res.verdict is Verdict.OK or (res.verdict is Verdict.LOOPBACK and accept_loopback):
        return None, None
    host = res.host
    if res.verdict is not Verdict.LOOPBACK:
        text = f"this node's own name {host} does not check out: {res.detail}"
        if rules.strict_self:
            return _strict_self(host, res, text), None
        return None, text
    loopback = [address for address in res.addresses if is_loopback(address)]
    where = f"this node's own name {host} resolves to loopback ({', '.join(loopback)})"
    if rules.strict_self:
        # Stacks that advertise their own resolved name ignore GLOO_SOCKET_IFNAME.
        text = f"{where}; map {host} to its cluster address in /etc/hosts"
        return _strict_self(host, res, text), None
    if ifname is None:
        reason = self_loopback_reason(
            host, loopback, detail=res.detail, emit_ifname=rules.emit_ifname, jax=rules.jax
        )
        return reason, None
    return None, (
        f"{where}; gloo binds {ifname} (GLOO_SOCKET_IFNAME) instead, but stacks that advertise "
        f"their own resolved name would not: map {host} to its cluster address in /etc/hosts"
    )


def why_acceptable(
    res: Resolution, *, accept_loopback: bool, lone: bool = False, ifname: str | None = None
) -> str | None:
    """Why ``res`` is fine here though its verdict is not OK; None when it is OK or a problem.

    For a resolution its judge passed (:func:`peer_reason` or :func:`judge_own` gave no
    reason), so /status can tell a verdict that is no problem from one that is: a lone node
    has no peer to misroute, accepted loopback means every node shares this host, and an own
    name on loopback is excused when gloo binds the pinned interface ``ifname`` instead.
    """
    if res.verdict is not Verdict.LOOPBACK:
        return None
    if lone:
        return "a single node: no peer dials this name, so loopback is fine"
    if accept_loopback:
        return "loopback is accepted: every node of the session runs on this host"
    if ifname is not None:
        return f"gloo binds {ifname} (GLOO_SOCKET_IFNAME), not the address of this name"
    return None


def _strict_self(host: str, res: Resolution, text: str) -> Reason:
    return Reason(
        "strict_self", f"{text} (fatal with --strict-self)", host=host, detail=str(res.verdict)
    )


# -- reasons ----------------------------------------------------------------------------


def loopback_reason(host: str, res: Resolution) -> Reason:
    """Not ready because a peer's name resolves to loopback here."""
    return Reason(
        "loopback_peer",
        f"peer {host} resolves to loopback ({', '.join(res.addresses)}) on this node, which "
        "would connect to itself; map the name to the peer's cluster address in /etc/hosts "
        "or DNS",
        host=host,
        detail=res.detail,
    )


def self_loopback_reason(
    host: str, loopback: Sequence[str], *, detail: str | None, emit_ifname: bool, jax: bool = False
) -> Reason:
    """Not ready because this node's own name resolves to loopback and no interface is pinned."""
    # Without GLOO_SOCKET_IFNAME gloo binds and publishes what its own host name resolves to,
    # and peers whose address sorts above it dial loopback (measured: docs/loopback.md).
    # JAX's gloo (XLA's; jax 0.10.2) reads no GLOO_SOCKET_IFNAME: measured, its context
    # fails with "Connection refused, remote=[127.0.1.1]" where torch's gloo succeeds.
    where = f"this node's own name {host} resolves to loopback ({', '.join(loopback)})"
    fix = f"map {host} to its cluster address in /etc/hosts"
    if jax:
        remedy = f"JAX's gloo ignores GLOO_SOCKET_IFNAME, so {fix}"
    elif emit_ifname:
        remedy = (
            "no interface that routes to the master was found to serve as "
            f"GLOO_SOCKET_IFNAME, so {fix}"
        )
    else:
        remedy = (
            f"{fix}, or drop --no-emit-ifname so GLOO_SOCKET_IFNAME pins the interface that "
            "routes to the master"
        )
    return Reason(
        "self_loopback",
        f"{where}, which gloo would publish to its peers; {remedy} (see docs/loopback.md)",
        host=host,
        detail=detail,
    )
