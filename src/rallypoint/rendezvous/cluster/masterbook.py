"""The master's join book: checks and records joins, issues cluster documents, serves long-polls,
and answers the reports of every node (its own, a worker's, a relay's batch).

The book also holds the cluster-wide verdict on the document it issued (``verdict``,
verdict.py), and starts it afresh with every new document.
"""

from __future__ import annotations

import asyncio
import bisect
import gzip
import hashlib
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from rallypoint import wire
from rallypoint.errors import JoinRejected
from rallypoint.model import ClusterDoc, ClusterSpec, Member
from rallypoint.rendezvous.cluster.verdict import ClusterVerdict, stale_generation
from rallypoint.rendezvous.waits import wait_until
from rallypoint.wire import cluster

#: Documents smaller than this are always sent as they are: gzip would not pay for itself.
GZIP_MIN_BYTES = 1024


class EncodedDoc(msgspec.Struct, frozen=True):
    """A cluster document encoded once: its JSON body, that body's SHA-256 and gzip of it."""

    body: bytes
    sha256: bytes
    #: ``body`` gzipped (deterministically: mtime 0), or None when the body is small.
    gzipped: bytes | None

    @classmethod
    def of(cls, doc: ClusterDoc) -> EncodedDoc:
        body = cluster.encode_cluster_doc(doc)
        # The document is repetitive JSON (~7x smaller gzipped): at thousands of nodes the
        # bytes written to every long-poll, not the CPU to encode them once, are the cost.
        packed = gzip.compress(body, mtime=0) if len(body) >= GZIP_MIN_BYTES else None
        return cls(body, hashlib.sha256(body).digest(), packed)

    @classmethod
    def reusing(
        cls, doc: ClusterDoc, current: ClusterDoc | None, cached: EncodedDoc | None
    ) -> EncodedDoc:
        """``doc`` encoded: ``cached`` when ``doc`` is ``current``, the document it encodes
        (the master's book and a relay keep their current document's encoding)."""
        if doc is current and cached is not None:
            return cached
        return cls.of(doc)


class MasterBook:
    """The master's record of joined nodes and the cluster document derived from it."""

    def __init__(self, spec: ClusterSpec, master_port: int, epoch: str) -> None:
        self.spec = spec
        self.master_port = master_port
        self.epoch = epoch
        self.members: dict[int, Member] = {}
        self.doc: ClusterDoc | None = None
        #: ``doc`` encoded once when issued: every long-poll answer shares the bytes
        #: (re-encoding per answer made N answers cost O(N^2)).
        self.encoded_doc: EncodedDoc | None = None
        # Ranks not joined yet, in order: a join removes its rank by bisection (a memmove in
        # C), so the waiting reason, rebuilt per join, never sorts (sorting a set per join
        # made a 4096-node herd spend ~0.4 CPU-s on it).
        self._missing = list(range(spec.nnodes))
        self._counter = 0
        self._changed = asyncio.Event()
        self._closed = False
        #: The cluster-wide verdict on ``doc``: every node's report of its checks.
        self.verdict = ClusterVerdict(spec)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every long-poll now (they answer "nothing new"): the master is going away."""
        self._closed = True
        self._changed.set()
        self.verdict.close()

    def missing(self) -> list[int]:
        """The ranks that have not joined yet, in order."""
        return list(self._missing)

    def encoded(self, doc: ClusterDoc) -> EncodedDoc:
        """``doc`` encoded for GET /v1/cluster; the cached encoding when it is ``self.doc``."""
        return EncodedDoc.reusing(doc, self.doc, self.encoded_doc)

    def check(self, request: wire.JoinRequest) -> None:
        """Refuse joins from another session, outside the spec, or from the wrong host."""
        spec, member = self.spec, request.member
        if request.session != spec.session:
            raise JoinRejected(
                409,
                "session_mismatch",
                f"join for session {request.session!r}, but this master serves "
                f"{spec.session!r}; give every node the same session",
            )
        if not 0 < member.rank < spec.nnodes:
            raise JoinRejected(
                400,
                "rank_out_of_range",
                f"rank {member.rank} cannot join: worker ranks are 1-{spec.nnodes - 1}",
            )
        expected = spec.hosts[member.rank]
        if member.host.lower() != expected.lower():
            raise JoinRejected(
                403,
                "impostor",
                f"host {member.host!r} claims rank {member.rank}, which the spec gives to "
                f"{expected!r}; check the node list and the node's own rank",
            )

    def record(self, member: Member) -> bool:
        """Store a join; True when it produced a new cluster document."""
        self.members[member.rank] = member
        missing = self._missing
        at = bisect.bisect_left(missing, member.rank)
        if at < len(missing) and missing[at] == member.rank:
            del missing[at]
        if self._missing:
            return False
        members = tuple(self.members[r] for r in range(self.spec.nnodes))
        if self.doc is not None and self.doc.members == members:
            return False
        self._counter += 1
        self.doc = ClusterDoc(
            session=self.spec.session,
            generation=f"{self.epoch}.{self._counter}",
            master_host=self.spec.master,
            master_port=self.master_port,
            members=members,
        )
        self.encoded_doc = EncodedDoc.of(self.doc)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        self.verdict.start(self.doc)
        return True

    async def wait(self, after: str | None, timeout_s: float) -> ClusterDoc | None:
        """A document whose generation is not ``after``, or None after ``timeout_s``."""

        def issued() -> bool:
            return self.doc is not None and self.doc.generation != after

        await wait_until(lambda: issued() or self._closed, lambda: self._changed, timeout_s)
        return self.doc if issued() else None


#: Sends a report and returns the master's verdict (a long-poll when ``seen`` is current).
Transport = Callable[[wire.Report], Awaitable[wire.Verdict]]


def local_transport(book: MasterBook, long_poll_s: float) -> Transport:
    """The master reports to its own book."""

    async def send(report: wire.Report) -> wire.Verdict:
        return await answer_reports(
            book,
            (report,),
            generation=report.generation,
            seen=report.seen,
            hold=True,
            long_poll_s=long_poll_s,
        )

    return send


async def answer_reports(
    book: MasterBook,
    reports: Sequence[wire.Report],
    *,
    generation: str,
    seen: int,
    hold: bool,
    long_poll_s: float,
) -> wire.Verdict:
    """Record reports (one node's, or a relay's batch); the verdict, held while it is quiet.

    JoinRejected (409 stale_generation) when ``generation`` is not the current document's.
    """
    for report in reports:
        book.verdict.report(report)  # checks each: session, rank and host, generation
    verdict = book.verdict.current
    if verdict is None or verdict.generation != generation:  # an empty batch: a pure poll
        raise stale_generation(generation, book.doc)
    # A node that passed has nothing to act on until the verdict lands or a failure
    # appears: hold its answer (one request per node on the happy path, not two).
    quiet = (
        hold
        and all(report.passed for report in reports)
        and not verdict.verified
        and not verdict.failures
    )
    if verdict.version != seen and not quiet:
        return verdict
    return await book.verdict.wait(generation, verdict.version, long_poll_s)
