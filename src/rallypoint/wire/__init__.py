"""Pure peer-message codec: joins and their answers, pokes, members, reports, verdicts.

Everything a peer sends is untrusted input. Each parser checks the size first, then the
JSON shape, then every field, and returns a frozen value or raises PeerMessageError naming
the field at fault; it never returns a half-validated value. msgspec writes every message
from its struct (fields.dump); the answers' and reports' fields at their defaults are left
out (omit_defaults), as peers that predate them sent them, and every parser reads an absent
field as its default. The rules for single fields are in wire/fields.py; the cluster
document, made of the members a join carries, in wire/cluster.py; a measured link's in
wire/links.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from rallypoint.core.links import LinkStat
from rallypoint.errors import PeerMessageError
from rallypoint.model import Member
from rallypoint.reasons import Reason

# Part of this module's contract: the APIs apply the same rules to query strings and addresses.
from rallypoint.wire.fields import (
    MAX_NODES,
    TOKEN,
    address,
    boolean,
    dump,
    generation,
    host_name,
    integer,
    load,
    reasons,
    session,
)
from rallypoint.wire.links import links_from
from rallypoint.wire.stamps import ClockFacts, ClockStamp, facts_from, stamp_from

#: Largest join or poke body accepted (a join carries at most MAX_ADDRESSES addresses).
MAX_JOIN_BYTES = 16 * 1024
#: Largest number of addresses one node may report.
MAX_ADDRESSES = 64


class JoinRequest(msgspec.Struct, frozen=True):
    """A worker's POST /v1/join: who it is and what it reserved."""

    session: str
    member: Member
    #: The generation the worker acted on last, if any (for diagnostics on the master).
    generation_seen: str | None = None


class JoinAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """The master's answer to a join: its epoch (new on every master start) and progress."""

    session: str
    epoch: str
    generation: str | None
    joined: int
    nnodes: int
    #: The answering node's clock (wire/stamps.py); absent from older masters.
    clock: ClockStamp | None = None


class Poke(msgspec.Struct, frozen=True):
    """The master's POST /v1/poke: "I (re)started or changed; re-join now"."""

    session: str
    epoch: str


def encode_join(request: JoinRequest) -> bytes:
    """The JSON body of a join request: the member's fields beside the session's."""
    return dump(
        {
            "session": request.session,
            "generation_seen": request.generation_seen,
            **msgspec.structs.asdict(request.member),
        }
    )


def parse_join(body: bytes) -> JoinRequest:
    """Validate a join body; PeerMessageError names the field at fault."""
    data = load(body, MAX_JOIN_BYTES, "join request")
    seen = data.get("generation_seen")
    return JoinRequest(
        session=session(data.get("session"), "session"),
        member=member_from(data, "join request"),
        generation_seen=None if seen is None else generation(seen, "generation_seen"),
    )


def encode_join_answer(answer: JoinAnswer) -> bytes:
    """The JSON body of the master's join answer."""
    return dump(answer)


def parse_join_answer(body: bytes) -> JoinAnswer:
    """Validate the master's join answer."""
    data = load(body, MAX_JOIN_BYTES, "join answer")
    gen = data.get("generation")
    nnodes = integer(data.get("nnodes"), "nnodes", 1, MAX_NODES)
    return JoinAnswer(
        session=session(data.get("session"), "session"),
        epoch=generation(data.get("epoch"), "epoch"),
        generation=None if gen is None else generation(gen, "generation"),
        joined=integer(data.get("joined"), "joined", 0, nnodes),
        nnodes=nnodes,
        clock=stamp_from(data.get("clock"), "join answer"),
    )


def encode_poke(poke: Poke) -> bytes:
    """The JSON body of a poke."""
    return dump(poke)


def parse_poke(body: bytes) -> Poke:
    """Validate a poke body."""
    data = load(body, MAX_JOIN_BYTES, "poke")
    return Poke(
        session=session(data.get("session"), "session"),
        epoch=generation(data.get("epoch"), "epoch"),
    )


# -- the cluster-wide verdict ---------------------------------------------------------------

#: Failures one report or verdict carries at most; the rest are counted, not listed.
MAX_FAILURES = 32
#: Ranks a verdict lists as still checking at most.
MAX_PENDING = 64
#: Largest report or verdict accepted.
MAX_REPORT_BYTES = 64 * 1024
_WINDOW_KINDS = frozenset({"master", "jax", "tf", "probe"})


class NetFacts(msgspec.Struct, frozen=True):
    """The interface a node routes to the master through, as shown in /status."""

    ifname: str | None = None
    mtu: int | None = None
    rdma: bool = False


class Report(msgspec.Struct, frozen=True, omit_defaults=True):
    """A node's POST /v1/report: its checks of one generation, and the verdict it saw last."""

    session: str
    generation: str
    rank: int
    host: str
    passed: bool
    failures: tuple[Reason, ...] = ()
    #: Window kinds this node could not open because the job already listens there.
    busy: frozenset[str] = frozenset()
    net: NetFacts = NetFacts()
    #: The verdict version the node holds; the master answers when it differs (long-poll).
    seen: int = -1
    #: The links this node measured (links.measured_peers), once its probes ran.
    links: tuple[LinkStat, ...] = ()
    #: The node's measured clock offset to the master (wire/stamps.py), if any.
    clock: ClockFacts | None = None


class Verdict(msgspec.Struct, frozen=True, omit_defaults=True):
    """The master's cluster-wide verdict on one generation."""

    session: str
    generation: str
    version: int
    verified: bool
    pending: tuple[int, ...]
    pending_count: int
    failures: tuple[Reason, ...]
    failure_count: int
    warnings: tuple[str, ...]
    #: The answering node's clock, stamped per answer (wire/stamps.py); left out when None.
    clock: ClockStamp | None = None


def encode_report(report: Report) -> bytes:
    """The JSON body of POST /v1/report (a node lists at most MAX_FAILURES failures)."""
    return dump(report)


def parse_report(body: bytes) -> Report:
    """Validate a report body; PeerMessageError names the field at fault."""
    return report_from(load(body, MAX_REPORT_BYTES, "report"))


def report_from(data: Mapping[str, object]) -> Report:
    """A report from its JSON object (a body, or an item of a relay's batch)."""
    busy = data.get("busy", [])
    if not isinstance(busy, list) or not all(
        isinstance(b, str) and b in _WINDOW_KINDS for b in busy
    ):
        raise PeerMessageError(f"report: busy must list some of {', '.join(sorted(_WINDOW_KINDS))}")
    net = data.get("net", {})
    if not isinstance(net, dict):
        raise PeerMessageError("report: net must be an object")
    ifname, mtu, rdma = net.get("ifname"), net.get("mtu"), net.get("rdma", False)
    if ifname is not None and (not isinstance(ifname, str) or not TOKEN.fullmatch(ifname)):
        raise PeerMessageError("report: net.ifname must be an interface name")
    if not isinstance(rdma, bool):
        raise PeerMessageError("report: net.rdma must be true or false")
    return Report(
        session=session(data.get("session"), "session"),
        generation=generation(data.get("generation"), "generation"),
        rank=integer(data.get("rank"), "rank", 0, MAX_NODES - 1),
        host=host_name(data.get("host"), "host"),
        passed=boolean(data.get("passed"), "passed"),
        failures=reasons(data.get("failures", []), "report", MAX_FAILURES),
        busy=frozenset(busy),
        net=NetFacts(
            ifname=ifname,
            mtu=None if mtu is None else integer(mtu, "net.mtu", 68, 1 << 20),
            rdma=rdma,
        ),
        seen=integer(data.get("seen", -1), "seen", -1, 1 << 62),
        links=links_from(data.get("links", []), "report"),
        clock=facts_from(data.get("clock"), "report"),
    )


def encode_verdict(verdict: Verdict) -> bytes:
    """The JSON body of the master's answer to a report (the verdict holds its own limits)."""
    return dump(verdict)


def parse_verdict(body: bytes) -> Verdict:
    """Validate the master's verdict."""
    data = load(body, MAX_REPORT_BYTES, "verdict")
    pending = data.get("pending", [])
    if not isinstance(pending, list) or len(pending) > MAX_PENDING:
        raise PeerMessageError(f"verdict: pending must be a list of at most {MAX_PENDING} ranks")
    warnings = data.get("warnings", [])
    if (
        not isinstance(warnings, list)
        or len(warnings) > MAX_FAILURES
        or not all(isinstance(w, str) and len(w) <= 1000 for w in warnings)
    ):
        raise PeerMessageError("verdict: warnings must be a short list of strings")
    return Verdict(
        session=session(data.get("session"), "session"),
        generation=generation(data.get("generation"), "generation"),
        version=integer(data.get("version"), "version", 0, 1 << 62),
        verified=boolean(data.get("verified"), "verified"),
        pending=tuple(integer(r, "pending[]", 0, MAX_NODES - 1) for r in pending),
        pending_count=integer(data.get("pending_count", 0), "pending_count", 0, MAX_NODES),
        failures=reasons(data.get("failures", []), "verdict", MAX_FAILURES),
        failure_count=integer(data.get("failure_count", 0), "failure_count", 0, 1 << 62),
        warnings=tuple(warnings),
        clock=stamp_from(data.get("clock"), "verdict"),
    )


def member_from(data: Mapping[str, object], where: str) -> Member:
    """A member from its JSON object; PeerMessageError names ``where`` and the field."""
    raw_addresses = data.get("addresses")
    if not isinstance(raw_addresses, list) or len(raw_addresses) > MAX_ADDRESSES:
        raise PeerMessageError(f"{where}: addresses must be a list of at most {MAX_ADDRESSES}")
    addresses = tuple(address(a, f"{where}: addresses[{i}]") for i, a in enumerate(raw_addresses))
    tf_port = data.get("tf_port")
    jax_port = data.get("jax_port")
    probe_port = data.get("probe_port")
    return Member(
        rank=integer(data.get("rank"), f"{where}: rank", 0, MAX_NODES - 1),
        host=host_name(data.get("host"), f"{where}: host"),
        addresses=tuple(dict.fromkeys(addresses)),
        tf_port=None if tf_port is None else integer(tf_port, f"{where}: tf_port", 1, 65535),
        jax_port=None if jax_port is None else integer(jax_port, f"{where}: jax_port", 1, 65535),
        probe_port=None
        if probe_port is None
        else integer(probe_port, f"{where}: probe_port", 1, 65535),
    )
