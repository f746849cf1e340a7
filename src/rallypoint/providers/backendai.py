"""The Backend.AI provider: the cluster variables Backend.AI injects into session containers.

Backend.AI names containers ``{role}{idx}`` (``main1``, ``sub1``, ``sub2`` ...), with a
1-based index per role, and lists them in BACKENDAI_CLUSTER_HOSTS in no promised order
(``sub1,main1,sub2`` happens). BACKENDAI_CLUSTER_LOCAL_RANK is 0 for main1 and N for subN
in a default session, but it is a per-container value that peers cannot see, so the node
order is computed from the shared host list alone.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers._common import (
    MAX_NODES,
    build,
    check_nnodes,
    choose_session,
    detected_by,
    digest,
    get,
    get_int,
    get_port,
    host_name,
    session_id,
    show,
    split_list,
    unique,
)

NAME = "backendai"
HOSTS = "BACKENDAI_CLUSTER_HOSTS"
HOST = "BACKENDAI_CLUSTER_HOST"
SIZE = "BACKENDAI_CLUSTER_SIZE"
ROLE = "BACKENDAI_CLUSTER_ROLE"
IDX = "BACKENDAI_CLUSTER_IDX"
LOCAL_RANK = "BACKENDAI_CLUSTER_LOCAL_RANK"
REPLICAS = "BACKENDAI_CLUSTER_REPLICAS"
SESSION_ID = "BACKENDAI_SESSION_ID"
MASTER_PORT = "BACKENDAI_DIST_MASTER_PORT"
MASTER = "RALLYPOINT_MASTER"

MAIN_ROLE = "main"
_NAMED = re.compile(r"([a-z]+)([0-9]{1,9})")
_ROLE = re.compile(r"[a-z][a-z0-9_-]{0,63}")


#: True when BACKENDAI_CLUSTER_HOSTS is set and not blank.
detects = detected_by(HOSTS)


def role_of(host: str) -> tuple[str, int] | None:
    """(role, idx) of a host named the Backend.AI way (``sub2`` -> ("sub", 2)), else None."""
    match = _NAMED.fullmatch(host.lower())
    if match is None:
        return None
    return match.group(1), int(match.group(2))


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """Nodes from BACKENDAI_CLUSTER_HOSTS: the main container first, then by role and index.

    The master is the host named ``main<N>`` (or RALLYPOINT_MASTER when containers carry
    custom host names), wherever it stands in the list; the others follow sorted by role
    name, then numeric index (``sub2`` before ``sub10``), then plain name.
    """
    raw = get(environ, HOSTS) or ""
    listed = [host_name(HOSTS, entry) for entry in split_list(HOSTS, raw)]
    unique(HOSTS, listed)
    check_nnodes(environ, SIZE, len(listed), HOSTS)
    _check_replicas(environ, listed)

    master = _master(environ, listed)
    rest = sorted((host for host in listed if host != master), key=_order_key)
    hosts = [master, *rest]

    own = _own_host(environ, hosts)
    rank = hosts.index(own)
    role = get(environ, ROLE)
    idx = get_int(environ, IDX, minimum=1, maximum=MAX_NODES)
    local_rank = get_int(environ, LOCAL_RANK, minimum=0, maximum=len(hosts) - 1)
    _check_own_role(own, master, role, idx)

    facts: list[tuple[str, str]] = []
    if role is not None:
        facts.append(("role", role))
    if idx is not None:
        facts.append(("idx", str(idx)))
    if local_rank is not None:
        facts.append(("local_rank", str(local_rank)))
    backend_session = get(environ, SESSION_ID)
    if backend_session is not None:
        backend_session = session_id(SESSION_ID, backend_session)
        facts.append(("session_id", backend_session))
        derived = f"backendai-{backend_session}"
    else:
        derived = f"backendai-{digest(*(host.lower() for host in hosts))}"
    return build(
        NAME,
        hosts,
        rank,
        choose_session(environ, derived),
        preferred_port=get_port(environ, MASTER_PORT),
        facts=facts,
    )


def _order_key(host: str) -> tuple[int, str, int]:
    named = role_of(host)
    if named is None:
        return (1, host.lower(), 0)
    return (0, named[0], named[1])


def _check_replicas(environ: Mapping[str, str], listed: list[str]) -> None:
    """BACKENDAI_CLUSTER_REPLICAS (``main:1,sub:3``) must add up to the list and its roles."""
    raw = get(environ, REPLICAS)
    if raw is None:
        return
    replicas: dict[str, int] = {}
    for entry in raw.split(","):
        role, sep, count = entry.strip().partition(":")
        role = role.strip().lower()
        if not sep or not _ROLE.fullmatch(role) or role in replicas:
            raise ClusterSpecError(
                f"{REPLICAS}={show(raw)} is malformed; it reads 'role:count,...' with each"
                " role once, e.g. 'main:1,sub:3'"
            )
        replicas[role] = _count(raw, count.strip())
    total = sum(replicas.values())
    if total != len(listed):
        raise ClusterSpecError(
            f"{REPLICAS}={show(raw)} adds up to {total} container(s) but {HOSTS} lists"
            f" {len(listed)}; the session's variables contradict each other"
        )
    if MAIN_ROLE in replicas and replicas[MAIN_ROLE] != 1:
        raise ClusterSpecError(
            f"{REPLICAS}={show(raw)} has {replicas[MAIN_ROLE]} main containers; a training"
            " session needs exactly one main container"
        )
    named = [role_of(host) for host in listed]
    if all(parsed is not None for parsed in named):
        counted: dict[str, int] = {}
        for parsed in named:
            if parsed is not None:
                counted[parsed[0]] = counted.get(parsed[0], 0) + 1
        if counted != {role: n for role, n in replicas.items() if n}:
            raise ClusterSpecError(
                f"{REPLICAS}={show(raw)} does not match the roles in"
                f" {HOSTS}={show(','.join(listed))}; the session's variables contradict each other"
            )


def _count(raw: str, value: str) -> int:
    if not value.isascii() or not value.isdigit() or len(value) > 6:
        raise ClusterSpecError(
            f"{REPLICAS}={show(raw)} has a bad count {show(value)}; counts are whole numbers"
        )
    return int(value)


def _master(environ: Mapping[str, str], listed: list[str]) -> str:
    """The main container's host: the one host named main<N>, or RALLYPOINT_MASTER among them."""
    mains = [host for host in listed if (role_of(host) or ("", 0))[0] == MAIN_ROLE]
    override = get(environ, MASTER)
    if override is not None:
        chosen = [host for host in listed if host.lower() == override.lower()]
        if not chosen:
            raise ClusterSpecError(
                f"{MASTER}={show(override)} is not one of {HOSTS}; name the main container's host"
            )
        if mains and chosen[0] not in mains:
            raise ClusterSpecError(
                f"{MASTER}={show(override)} is not the main container {show(mains[0])};"
                f" unset {MASTER} (it is only needed for custom host names)"
            )
        return chosen[0]
    if len(mains) == 1:
        return mains[0]
    if not mains:
        raise ClusterSpecError(
            f"{HOSTS}={show(','.join(listed))} names no main container (main<N>); set {MASTER}"
            " to the main container's host name on every node"
        )
    raise ClusterSpecError(
        f"{HOSTS}={show(','.join(listed))} names {len(mains)} main containers; set {MASTER}"
        " to the one that runs the training master, on every node"
    )


def _own_host(environ: Mapping[str, str], hosts: list[str]) -> str:
    """This container's entry in hosts, from BACKENDAI_CLUSTER_HOST, ROLE+IDX or HOSTNAME."""
    candidates: list[tuple[str, str]] = []
    own = get(environ, HOST)
    if own is not None:
        candidates.append((HOST, own))
    else:
        role, idx = get(environ, ROLE), get(environ, IDX)
        if role is not None and idx is not None:
            candidates.append((f"{ROLE}+{IDX}", role + idx))
        hostname = get(environ, "HOSTNAME")
        if hostname is not None:
            candidates.append(("HOSTNAME", hostname))
    for key, name in candidates:
        for host in hosts:
            if host.lower() == name.lower():
                return host
        if key == HOST:
            raise ClusterSpecError(
                f"{HOST}={show(name)} is not one of {HOSTS}={show(','.join(hosts))}; the"
                " session's variables contradict each other"
            )
    raise ClusterSpecError(
        f"cannot tell which container of {HOSTS} this is; set {HOST} to this container's host name"
    )


def _check_own_role(own: str, master: str, role: str | None, idx: int | None) -> None:
    """ROLE and IDX must agree with this container's host name and with who is master."""
    named = role_of(own)
    if named is not None and role is not None and named[0] != role.lower():
        raise ClusterSpecError(
            f"{ROLE}={show(role)} contradicts this container's host name {show(own)};"
            " the session's variables contradict each other"
        )
    if named is not None and idx is not None and named[1] != idx:
        raise ClusterSpecError(
            f"{IDX}={idx} contradicts this container's host name {show(own)};"
            " the session's variables contradict each other"
        )
    if role is not None and (role.lower() == MAIN_ROLE) != (own == master):
        raise ClusterSpecError(
            f"{ROLE}={show(role)} on {show(own)} contradicts the main container {show(master)};"
            f" check {HOSTS} and {MASTER}"
        )
