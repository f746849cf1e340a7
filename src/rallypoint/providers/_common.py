"""Shared reading and validation for the providers: variables, numbers, host names, sessions."""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence

from rallypoint.core import names
from rallypoint.core.names import HostProblem
from rallypoint.errors import ClusterSpecError
from rallypoint.model import MAX_NODES, ClusterSpec

# The largest cluster a document may describe is the largest any provider accepts; it also
# caps hostlist expansion (memory bombs).
__all__ = ["MAX_NODES"]

_INT = re.compile(r"[0-9]{1,9}")
_SESSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


def show(value: str, limit: int = 80) -> str:
    """Quote a value for a one-line error message, shortened when long."""
    if len(value) > limit:
        return repr(value[:limit]) + "..."
    return repr(value)


def get(environ: Mapping[str, str], key: str) -> str | None:
    """The stripped value of key, or None when it is unset or blank."""
    value = environ.get(key)
    if value is None:
        return None
    value = value.strip()
    return value or None


def detected_by(key: str) -> Callable[[Mapping[str, str]], bool]:
    """A provider's ``detects`` for the variable it is known by: set and not blank."""

    def detects(environ: Mapping[str, str]) -> bool:
        return get(environ, key) is not None

    detects.__doc__ = f"True when {key} is set and not blank."
    return detects


def require(environ: Mapping[str, str], key: str, why: str) -> str:
    """The value of key; ClusterSpecError saying why it is needed when it is unset or blank."""
    value = get(environ, key)
    if value is None:
        raise ClusterSpecError(f"{key} is not set; {why}")
    return value


def parse_int(key: str, value: str, *, minimum: int, maximum: int) -> int:
    """A decimal integer in [minimum, maximum] read from variable key."""
    if not _INT.fullmatch(value):
        raise ClusterSpecError(
            f"{key}={show(value)} is not a decimal integer; set it to a number"
            f" from {minimum} to {maximum}"
        )
    number = int(value)
    if not minimum <= number <= maximum:
        raise ClusterSpecError(
            f"{key}={show(value)} is out of range; set it to a number from {minimum} to {maximum}"
        )
    return number


def get_int(environ: Mapping[str, str], key: str, *, minimum: int, maximum: int) -> int | None:
    """parse_int on key's value, or None when key is unset or blank."""
    value = get(environ, key)
    return None if value is None else parse_int(key, value, minimum=minimum, maximum=maximum)


def get_port(environ: Mapping[str, str], key: str) -> int | None:
    """A TCP port (1..65535) from key, or None when unset or blank."""
    return get_int(environ, key, minimum=1, maximum=65535)


def ip_literal(value: str) -> str | None:
    """The canonical form of an IPv4/IPv6 literal (brackets allowed around IPv6), else None."""
    text = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    return str(address)


def host_name(key: str, value: str, *, allow_ip: bool = False) -> str:
    """A validated host name (RFC 1123), or with allow_ip a canonical IPv4/IPv6 literal."""
    literal = ip_literal(value) if allow_ip else None
    problem = names.host_problem(literal or value, ip=allow_ip)
    if problem is None:
        return literal or value
    what = "host names or IP addresses" if allow_ip else "host names"
    if problem is HostProblem.ZONE_ID:
        raise ClusterSpecError(
            f"{key}: {show(value)} carries an IPv6 zone id, which means something"
            " different on every host; use a global or unique-local address"
        )
    if problem is HostProblem.EMPTY:
        raise ClusterSpecError(f"{key} has an empty entry; list {what} separated by commas")
    if problem is HostProblem.TRAILING_DOT:
        raise ClusterSpecError(f"{key}: {show(value)} ends with a dot; drop the trailing dot")
    if problem is HostProblem.TOO_LONG:
        raise ClusterSpecError(
            f"{key}: {show(value)} is longer than 253 characters; use a shorter host name"
        )
    if problem is HostProblem.NUMERIC:
        hint = "write a dotted-quad IPv4 address" if allow_ip else "use the node's host name"
        raise ClusterSpecError(
            f"{key}: {show(value)} looks like a number, which resolvers read as an address; {hint}"
        )
    raise ClusterSpecError(
        f"{key}: {show(value)} is not a valid host name (RFC 1123: dot-separated labels"
        f" of 1-63 letters, digits or inner hyphens); list {what}"
    )


def split_list(key: str, value: str) -> list[str]:
    """Comma-separated entries of key, each stripped of surrounding blanks."""
    entries = [entry.strip() for entry in value.split(",")]
    if len(entries) > MAX_NODES:
        raise ClusterSpecError(
            f"{key} lists {len(entries)} entries; at most {MAX_NODES} nodes are supported"
        )
    return entries


def unique(key: str, hosts: Sequence[str]) -> None:
    """ClusterSpecError when a host appears twice (host names compare case-insensitively)."""
    seen: set[str] = set()
    for host in hosts:
        folded = host.lower()
        if folded in seen:
            raise ClusterSpecError(
                f"{key} lists {show(host)} more than once; every node must appear exactly once"
            )
        seen.add(folded)


def find_host(hosts: Sequence[str], name: str) -> int | None:
    """Position of name in hosts: exact (case-insensitive), else a unique short-name match."""
    folded = name.lower()
    exact = [i for i, host in enumerate(hosts) if host.lower() == folded]
    if exact:
        return exact[0]
    short = folded.split(".", 1)[0]
    matches = [i for i, host in enumerate(hosts) if host.lower().split(".", 1)[0] == short]
    return matches[0] if len(matches) == 1 else None


def digest(*parts: str) -> str:
    """A short stable digest of parts: every node computes the same one from the same input."""
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode("utf-8", "surrogatepass"))
        hasher.update(b"\0")
    return hasher.hexdigest()[:16]


def session_id(key: str, value: str) -> str:
    """A validated session id: 1-128 of letters, digits and . _ : - starting alphanumeric."""
    if not _SESSION.fullmatch(value):
        raise ClusterSpecError(
            f"{key}={show(value)} is not a usable session id; use 1-128 letters, digits,"
            " '.', '_', ':' or '-', starting with a letter or digit"
        )
    return value


def choose_session(environ: Mapping[str, str], derived: str) -> str:
    """RALLYPOINT_SESSION when set (it wins for every provider), else the provider's id."""
    value = get(environ, "RALLYPOINT_SESSION")
    if value is not None:
        return session_id("RALLYPOINT_SESSION", value)
    return derived


def hosts_session(environ: Mapping[str, str], prefix: str, hosts: Sequence[str]) -> str:
    """RALLYPOINT_SESSION when set, else prefix and a digest of the (case-folded) host names."""
    return choose_session(environ, f"{prefix}-{digest(*(host.lower() for host in hosts))}")


def check_nnodes(environ: Mapping[str, str], key: str, count: int, source: str) -> None:
    """ClusterSpecError when the size variable key disagrees with the node list's length."""
    declared = get_int(environ, key, minimum=1, maximum=MAX_NODES)
    if declared is not None and declared != count:
        raise ClusterSpecError(
            f"{key}={declared} but {source} names {count} node(s); make them agree"
        )


def build(
    provider: str,
    hosts: Sequence[str],
    rank: int,
    session: str,
    *,
    preferred_port: int | None = None,
    facts: Sequence[tuple[str, str]] = (),
) -> ClusterSpec:
    """A ClusterSpec after the checks every provider shares: size, rank range, uniqueness."""
    if not hosts:
        raise ClusterSpecError(f"the {provider} provider found no nodes; list at least one")
    if len(hosts) > MAX_NODES:
        raise ClusterSpecError(
            f"the {provider} provider found {len(hosts)} nodes; at most {MAX_NODES} are supported"
        )
    if not 0 <= rank < len(hosts):
        raise ClusterSpecError(
            f"the {provider} provider placed this node at rank {rank} of {len(hosts)}; check"
            " this node's rank variable"
        )
    unique(f"the {provider} node list", hosts)
    return ClusterSpec(
        provider=provider,
        hosts=tuple(hosts),
        rank=rank,
        nnodes=len(hosts),
        session=session,
        preferred_port=preferred_port,
        # One node has no peers: its own name on loopback cannot misroute anyone.
        loopback_ok=len(hosts) == 1,
        facts=tuple(facts),
    )
