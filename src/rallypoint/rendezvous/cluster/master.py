"""The master's role: answer joins, long-polls and reports from its book, and poke the workers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from rallypoint import wire
from rallypoint.core import fanout, names
from rallypoint.core.clock import refused_reason
from rallypoint.errors import JoinRejected, PeerDown
from rallypoint.model import ClusterDoc, Member
from rallypoint.net import resolve
from rallypoint.reasons import Reason
from rallypoint.rendezvous.cluster.masterbook import MasterBook, answer_reports, local_transport
from rallypoint.rendezvous.context import NodeContext
from rallypoint.wire import batch as wirebatch

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")

#: Pokes are best effort: a worker that does not answer this fast is not waited for.
POKE_TIMEOUT_S = 2.0

#: Above this many nodes each join is logged at debug, with an INFO line per tenth joined:
#: a line per join cost ~4 % of a 4096-node master's CPU and floods the log.
JOIN_LOG_ALL_NODES = 256


def _log_join(
    member: Member, remote: str | None, relay: int | None, before: int, joined: int, nnodes: int
) -> None:
    fields: dict[str, object] = {"rank": member.rank, "host": member.host, "remote": remote}
    if relay is not None:
        fields["relay"] = relay  # remote is then the relay's address
    if nnodes <= JOIN_LOG_ALL_NODES:
        log.info("joined", extra=fields)
        return
    log.debug("joined", extra=fields)
    step = max(1, nnodes // 10)
    if joined != before and (joined // step != before // step or joined == nnodes):
        log.info("joins_progress", extra={"joined": joined, "nnodes": nnodes})


class Documents(Protocol):
    """Where the master's documents and re-joins go on its own node (the verification loop)."""

    def accept(self, doc: ClusterDoc) -> None: ...

    def recheck(self, host: str) -> None: ...


class Master:
    """The master's side of the rendezvous, beside its book (node rank 0 only)."""

    def __init__(self, book: MasterBook, ctx: NodeContext, *, documents: Documents) -> None:
        self.book = book
        self.ctx = ctx
        self.documents = documents
        self.epoch = book.epoch
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Rank -> (its clock minus ours, the limit) of the last message refused as stale,
        #: until that rank joins (clock_reasons).
        self.refused_skew: dict[int, tuple[float, float]] = {}

    async def close(self) -> None:
        """Cancel the pokes in flight; closing twice is safe."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def run(self, own: Member) -> None:
        """Record our own join, then accept every document the book issues until it closes."""
        book = self.book
        book.record(own)
        self.ctx.peers.joined(own, None, self.ctx.readiness.uptime_s)
        self.ctx.readiness.not_ready(self._waiting_reason(book), *self._clock_reasons(book))
        # Workers may be deep in a backoff pause: wake them so nobody waits it out.
        self._poke_workers()
        after: str | None = None
        while not book.closed:
            doc = await book.wait(after, timeout_s=3600.0)
            if doc is not None:
                first = after is None
                after = doc.generation
                self.documents.accept(doc)
                if not first:
                    # A worker outside its long-poll (in a backoff pause after a lost
                    # connection) would miss the new document until its pause ends.
                    self._poke_workers()

    def _poke_workers(self) -> None:
        # In a fan-out tree the master pokes its own group and the relays; each relay pokes
        # its group in turn (relay.py), so no node sends thousands of pokes.
        spec = self.ctx.spec
        size = fanout.group_size(spec.nnodes, self.ctx.settings.relay_group_size)
        ranks = range(1, spec.nnodes) if size == 0 else range(1, size)
        for rank in [*ranks, *fanout.relays(size, spec.nnodes)]:
            self._spawn(self._poke(spec.hosts[rank]))

    def _waiting_reason(self, book: MasterBook) -> Reason:
        missing = book.missing()
        names = ", ".join(self.ctx.spec.hosts[r] for r in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        return Reason(
            "waiting_for_join",
            f"{len(missing)} of {self.ctx.spec.nnodes} nodes have not joined yet: {names}{more}",
            ranks=tuple(missing),
        )

    def clock_refused(self, host: str, skew_s: float, limit_s: float) -> None:
        """A message from ``host`` was refused as ``skew_s`` ahead of our clock: name it in the
        waiting reasons until that node joins."""
        spec, book = self.ctx.spec, self.book
        rank = next((r for r, h in enumerate(spec.hosts) if h == host), None)
        if rank is None or rank == spec.rank:
            return
        self.refused_skew[rank] = (skew_s, limit_s)
        if book.doc is None:
            self.ctx.readiness.not_ready(self._waiting_reason(book), *self._clock_reasons(book))

    def _clock_reasons(self, book: MasterBook) -> list[Reason]:
        """A clock_skew reason for each node not joined whose messages were refused as stale."""
        unjoined = [
            (rank, refused) for rank, refused in sorted(self.refused_skew.items())
            if rank not in book.members
        ]  # fmt: skip
        return [
            refused_reason(self.ctx.spec.hosts[rank], rank, skew_s, limit_s)
            for rank, (skew_s, limit_s) in unjoined[:8]
        ]

    def handle_join(self, request: wire.JoinRequest, remote: str | None) -> wire.JoinAnswer:
        """Record a worker's join; JoinRejected when refused."""
        return self._record([request], remote)

    def handle_joins(self, batch: wirebatch.JoinBatch, remote: str | None) -> wire.JoinAnswer:
        """Record a relay's batch of its group's joins, all or none; JoinRejected when refused."""
        requests = [wire.JoinRequest(batch.session, m) for m in batch.members]
        return self._record(requests, remote, relay=batch.relay)

    def _record(
        self, requests: list[wire.JoinRequest], remote: str | None, relay: int | None = None
    ) -> wire.JoinAnswer:
        """Check every join, then record them all: one worker's, or a relay's batch (``relay``
        its rank, ``remote`` its address)."""
        book = self.book
        try:
            for request in requests:
                book.check(request)
        except JoinRejected:
            self.ctx.metrics.joins.labels("rejected").inc(len(requests))
            raise
        self.ctx.metrics.joins.labels("accepted").inc(len(requests))
        for request in requests:
            member = request.member
            self.refused_skew.pop(member.rank, None)
            before = len(book.members)
            changed = book.record(member)
            self.ctx.peers.joined(member, remote, self.ctx.readiness.uptime_s, relay=relay)
            if not changed:
                self.documents.recheck(member.host)
            _log_join(member, remote, relay, before, len(book.members), self.ctx.spec.nnodes)
        if book.doc is None:
            self.ctx.readiness.not_ready(self._waiting_reason(book), *self._clock_reasons(book))
        return wire.JoinAnswer(
            session=self.ctx.spec.session,
            epoch=self.epoch,
            generation=None if book.doc is None else book.doc.generation,
            joined=len(book.members),
            nnodes=self.ctx.spec.nnodes,
        )

    async def handle_reports(self, batch: wirebatch.ReportBatch) -> wire.Verdict:
        """Record a relay's batch of its group's reports; the verdict, long-polled like one."""
        return await answer_reports(
            self.book,
            batch.reports,
            generation=batch.generation,
            seen=batch.seen,
            hold=batch.hold,
            long_poll_s=self.ctx.settings.long_poll_s,
        )

    async def handle_cluster(self, after: str | None) -> ClusterDoc | None:
        """Long-poll for a document newer than ``after``; None on timeout."""
        return await self.book.wait(after, self.ctx.settings.long_poll_s)

    async def handle_report(self, report: wire.Report) -> wire.Verdict:
        """Record a node's checks; the verdict, long-polled while unchanged."""
        return await local_transport(self.book, self.ctx.settings.long_poll_s)(report)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poke(self, host: str) -> None:
        await poke_host(self.ctx, host, self.epoch)


async def poke_host(ctx: NodeContext, host: str, epoch: str) -> None:
    """Best effort: tell a worker's peer API to re-join now (the master's or a relay's poke)."""
    res = await resolve.check(ctx.resolver, host, None, timeout_s=POKE_TIMEOUT_S)
    if names.dials_self(res, accept_loopback=ctx.accept_loopback):
        # A worker's name on loopback here would poke ourselves.
        ctx.metrics.pokes_sent.labels("skipped").inc()
        return
    body = wire.encode_poke(wire.Poke(ctx.spec.session, epoch))
    for address in res.addresses:
        try:
            ok = await ctx.client.post_poke(ctx.endpoint(host, address), body, POKE_TIMEOUT_S)
        except PeerDown:
            continue
        ctx.metrics.pokes_sent.labels("accepted" if ok else "refused").inc()
        return
    ctx.metrics.pokes_sent.labels("unreachable").inc()
