"""Pure peer-message codec: joins and their answers, pokes, members, reports, verdicts.

Everything a peer sends is untrusted input. Each parser checks the size first, then decodes
the body into its struct (wire/fields.load: msgspec checks every field's type and declared
bounds), then applies what a type cannot say: host names and addresses, and the rules that
tie one field to another. It returns a frozen value or raises PeerMessageError naming the
field at fault; it never returns a half-validated value. msgspec writes every message from
its struct (fields.dump); the answers' and reports' fields at their defaults are left out
(omit_defaults), and every parser reads an absent field as its default. The cluster
document, made of the members a join carries, is in wire/cluster.py.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from rallypoint.core.clock import ClockFacts, ClockStamp
from rallypoint.core.links import LinkStat
from rallypoint.errors import PeerMessageError
from rallypoint.model import (
    MAX_ADDRESSES,
    MAX_NODES,
    Member,
    Nodes,
    Rank,
    Session,
    Token,
    at_most,
    one_of,
    within,
)
from rallypoint.reasons import MAX_TEXT, Reason
from rallypoint.wire.fields import (
    addresses,
    dump,
    generation,
    host_name,
    load,
    reasons,
)
from rallypoint.wire.stamps import checked_stamp

__all__ = [
    "MAX_ADDRESSES",
    "MAX_NODES",
    "generation",
    "host_name",
]

#: Largest join or poke body accepted (a join carries at most MAX_ADDRESSES addresses).
MAX_JOIN_BYTES = 16 * 1024


class JoinRequest(msgspec.Struct, frozen=True):
    """A worker's POST /v1/join: who it is and what it reserved."""

    session: Session
    member: Member
    #: The generation the worker acted on last, if any (for diagnostics on the master).
    generation_seen: Token | None = None


class _JoinHead(msgspec.Struct, frozen=True):
    """A join body's own fields, beside its member's."""

    session: Session
    generation_seen: Token | None = None


class JoinAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """The master's answer to a join: its epoch (new on every master start) and progress."""

    session: Session
    epoch: Token
    generation: Token | None
    joined: Nodes
    nnodes: Annotated[int, within(1, MAX_NODES)]
    #: The answering node's clock (core/clock.py); absent from older masters.
    clock: ClockStamp | None = None


class Poke(msgspec.Struct, frozen=True):
    """The master's POST /v1/poke: "I (re)started or changed; re-join now"."""

    session: Session
    epoch: Token


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
    head = load(body, _JoinHead, MAX_JOIN_BYTES, "join request")
    member = checked_member(load(body, Member, MAX_JOIN_BYTES, "join request"), "join request")
    return JoinRequest(head.session, member, head.generation_seen)


def encode_join_answer(answer: JoinAnswer) -> bytes:
    """The JSON body of the master's join answer."""
    return dump(answer)


def parse_join_answer(body: bytes) -> JoinAnswer:
    """Validate the master's join answer."""
    answer = load(body, JoinAnswer, MAX_JOIN_BYTES, "join answer")
    if answer.joined > answer.nnodes:
        raise PeerMessageError("join answer: joined must be at most nnodes")
    checked_stamp(answer.clock, "join answer")
    return answer


def encode_poke(poke: Poke) -> bytes:
    """The JSON body of a poke."""
    return dump(poke)


def parse_poke(body: bytes) -> Poke:
    """Validate a poke body."""
    return load(body, Poke, MAX_JOIN_BYTES, "poke")


# -- the cluster-wide verdict ---------------------------------------------------------------

#: Failures one report or verdict carries at most; the rest are counted, not listed.
MAX_FAILURES = 32
#: Ranks a verdict lists as still checking at most.
MAX_PENDING = 64
#: Largest report or verdict accepted.
MAX_REPORT_BYTES = 64 * 1024
#: Links one report may carry (a node measures at most links.ALL_PAIRS_MAX - 1, or 2).
MAX_LINKS = 64
WINDOW_KINDS = ("master", "jax", "tf", "probe")
Failures = Annotated[tuple[Reason, ...], at_most(MAX_FAILURES)]
Count = Annotated[int, within(0, 1 << 62)]
#: The verdict version a node holds (-1: none yet).
Seen = Annotated[int, within(-1, 1 << 62)]


class NetFacts(msgspec.Struct, frozen=True):
    """The interface a node routes to the master through, as shown in /status."""

    ifname: Token | None = None
    mtu: Annotated[int, within(68, 1 << 20)] | None = None
    rdma: bool = False


class Report(msgspec.Struct, frozen=True, omit_defaults=True):
    """A node's POST /v1/report: its checks of one generation, and the verdict it saw last."""

    session: Session
    generation: Token
    rank: Rank
    #: A host name or an IP literal (fields.host_name checks it after decoding).
    host: str
    passed: bool
    failures: Failures = ()
    #: Window kinds this node could not open because the job already listens there.
    busy: frozenset[Annotated[str, one_of(WINDOW_KINDS)]] = frozenset()
    net: NetFacts = NetFacts()
    #: The verdict version the node holds; the master answers when it differs (long-poll).
    seen: Seen = -1
    #: The links this node measured (links.measured_peers), once its probes ran.
    links: Annotated[tuple[LinkStat, ...], at_most(MAX_LINKS)] = ()
    #: The node's measured clock offset to the master (core/clock.py), if any.
    clock: ClockFacts | None = None


class Verdict(msgspec.Struct, frozen=True, omit_defaults=True):
    """The master's cluster-wide verdict on one generation."""

    session: Session
    generation: Token
    version: Count
    verified: bool
    pending: Annotated[tuple[Rank, ...], at_most(MAX_PENDING)]
    pending_count: Nodes
    failures: Failures
    failure_count: Count
    warnings: Annotated[tuple[Annotated[str, at_most(MAX_TEXT)], ...], at_most(MAX_FAILURES)]
    #: The answering node's clock, stamped per answer (core/clock.py); left out when None.
    clock: ClockStamp | None = None


def encode_report(report: Report) -> bytes:
    """The JSON body of POST /v1/report (a node lists at most MAX_FAILURES failures)."""
    return dump(report)


def parse_report(body: bytes) -> Report:
    """Validate a report body; PeerMessageError names the field at fault."""
    return checked_report(load(body, Report, MAX_REPORT_BYTES, "report"), "report")


def checked_report(report: Report, where: str) -> Report:
    """A decoded report with its host names checked (a body, or an item of a relay's batch)."""
    return msgspec.structs.replace(
        report,
        host=host_name(report.host, f"{where}: host"),
        failures=reasons(report.failures, where),
    )


def encode_verdict(verdict: Verdict) -> bytes:
    """The JSON body of the master's answer to a report (the verdict holds its own limits)."""
    return dump(verdict)


def parse_verdict(body: bytes) -> Verdict:
    """Validate the master's verdict."""
    verdict = load(body, Verdict, MAX_REPORT_BYTES, "verdict")
    checked_stamp(verdict.clock, "verdict")
    return msgspec.structs.replace(verdict, failures=reasons(verdict.failures, "verdict"))


def checked_member(member: Member, where: str) -> Member:
    """A decoded member with its host name and addresses checked, canonical and each once."""
    return msgspec.structs.replace(
        member,
        host=host_name(member.host, f"{where}: host"),
        addresses=addresses(member.addresses, where),
    )
