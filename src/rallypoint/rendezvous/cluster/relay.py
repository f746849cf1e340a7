"""A relay's role: its group joins and reports here, and the master hears them in batches.

A relay is a worker (it joins the master itself and follows its documents) that also serves
its group's joins, cluster long-polls and reports with the master's semantics. The master
then handles a few requests per relay instead of a few per node (docs/scale.md). A group
member that cannot get an answer here joins the master directly (worker.py), so a relay is a
fast path, never a single point of failure.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from rallypoint import wire
from rallypoint.core import fanout
from rallypoint.core.backoff import Backoff
from rallypoint.errors import JoinRejected
from rallypoint.model import ClusterDoc, Member
from rallypoint.net.pause import Pause
from rallypoint.rendezvous.cluster.masterbook import EncodedDoc
from rallypoint.rendezvous.cluster.upstream import Upstream
from rallypoint.rendezvous.cluster.verdict import stale_generation
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.waits import coalesce, wait_until
from rallypoint.wire import batch as wirebatch
from rallypoint.wire import routes
from rallypoint.wire.fields import dump

#: Longest a join waits here for the master's word before the member is told to go direct.
JOIN_WAIT_S = 5.0
#: Joins and reports arriving this close together go to the master in one batch (a herd's
#: group arrives within milliseconds; a lone re-join waits this long at most).
COALESCE_S = 0.02


def _facts(report: wire.Report) -> object:
    """What the master acts on in a report (``seen`` is only the sender's long-poll state)."""
    return (report.passed, report.failures, report.busy, report.net)


def _member_size(member: Member) -> int:
    return len(dump(member))


def _report_size(report: wire.Report) -> int:
    return len(wire.encode_report(report))


class Relay:
    """One relay's group service, beside the node's own worker loop."""

    def __init__(
        self, ctx: NodeContext, *, poke: Callable[[str, str], Coroutine[Any, Any, None]]
    ) -> None:
        self.ctx = ctx
        spec = ctx.spec
        size = fanout.group_size(spec.nnodes, ctx.settings.relay_group_size)
        #: The ranks this relay serves (itself excluded).
        self.ranks = fanout.group(spec.rank, size, spec.nnodes)
        self._send_poke = poke
        #: The master: where batches go (its peer API) and its epoch, from our own last join.
        self.upstream = Upstream(ctx, self._unavailable)
        self.epoch: str | None = None
        self._upstream_known = asyncio.Event()
        self.members: dict[int, Member] = {}
        self._unsent: dict[int, Member] = {}
        self._join_waiters: dict[int, list[asyncio.Future[wire.JoinAnswer]]] = {}
        #: Members told to join the master directly: poked once the master answers us.
        self._turned_away: set[int] = set()
        self._joins_due = asyncio.Event()
        self.doc: ClusterDoc | None = None
        self.encoded_doc: EncodedDoc | None = None
        self._doc_changed = asyncio.Event()
        self.reports: dict[int, wire.Report] = {}
        self._unsent_reports: dict[int, wire.Report] = {}
        self._reports_due = asyncio.Event()
        self.verdict: wire.Verdict | None = None
        self._verdict_changed = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- what the node's own worker loop tells the relay ------------------------------------

    def upstream_joined(self, target: tuple[str, int], answer: wire.JoinAnswer) -> None:
        """This node joined the master at ``target``: batches go there; a new epoch re-sends all."""
        self.upstream.target = target
        if self.epoch is None:
            # Members that started before this sidecar listened went to the master directly
            # and stay there until poked: bring them into the tree.
            self._turned_away.update(set(self.ranks) - set(self.members))
        if answer.epoch != self.epoch:
            restarted = self.epoch is not None
            self.epoch = answer.epoch
            # A (re)started master knows none of the group: tell it everyone we know.
            self._unsent.update(self.members)
            if self._unsent:
                self._joins_due.set()
            if restarted:
                self._set_doc(None)
                self._poke(self.ranks)  # their answers carry the old epoch: re-join here
        if self._turned_away:
            # They went to the master directly (maybe not up then) and stay there until
            # poked: bring them back to the tree now that it works.
            self._poke(sorted(self._turned_away))
            self._turned_away.clear()
        self._upstream_known.set()

    def publish(self, doc: ClusterDoc) -> None:
        """This node accepted the master's document: serve it to the group."""
        later = self.doc is not None
        self._set_doc(doc)
        if later:
            # A member outside its long-poll (in a backoff pause) would miss it until then.
            self._poke(self.ranks)

    # -- the group's requests ---------------------------------------------------------------

    async def handle_join(self, request: wire.JoinRequest, remote: str | None) -> wire.JoinAnswer:
        """Hold a member's join until the master accepted it in a batch; its answer."""
        member = request.member
        self._check(request.session, member.rank, member.host)
        self.members[member.rank] = member
        self._unsent[member.rank] = member
        waiter: asyncio.Future[wire.JoinAnswer] = asyncio.get_running_loop().create_future()
        self._join_waiters.setdefault(member.rank, []).append(waiter)
        self._joins_due.set()
        # Answer before the member's own join timeout (the same setting on every node), so
        # it hears "go direct" instead of timing out.
        hold_s = min(JOIN_WAIT_S, 0.8 * self.ctx.settings.resolve_timeout_s)
        answered = False
        try:
            async with asyncio.timeout(hold_s):
                answer = await waiter
            answered = True
            return answer
        except TimeoutError:
            raise self._unavailable(f"it has not reached the master within {hold_s:g}s") from None
        finally:
            if not answered:
                self._turned_away.add(member.rank)
            waiters = self._join_waiters.get(member.rank, [])
            if waiter in waiters:
                waiters.remove(waiter)

    async def handle_cluster(self, after: str | None) -> ClusterDoc | None:
        """Long-poll for a document newer than ``after``; None on timeout."""
        if await wait_until(
            lambda: self.doc is not None and self.doc.generation != after,
            lambda: self._doc_changed,
            self.ctx.settings.long_poll_s,
        ):
            return self.doc
        return None

    def encoded(self, doc: ClusterDoc) -> EncodedDoc:
        """``doc`` encoded for GET /v1/cluster; the cached encoding when it is ``self.doc``."""
        return EncodedDoc.reusing(doc, self.doc, self.encoded_doc)

    async def handle_report(self, report: wire.Report) -> wire.Verdict:
        """Record a member's checks for the next batch; the master's verdict, held while quiet."""
        self._check(report.session, report.rank, report.host)
        doc = self.doc
        if doc is None or report.generation != doc.generation:
            raise stale_generation(report.generation, doc)
        old = self.reports.get(report.rank)
        self.reports[report.rank] = report
        if old is None or _facts(old) != _facts(report):
            self._unsent_reports[report.rank] = report
            self._reports_due.set()
        long_poll_s = self.ctx.settings.long_poll_s
        await wait_until(
            lambda: self._current_verdict(doc) is not None,
            lambda: self._verdict_changed,
            long_poll_s,
        )
        verdict = self._current_verdict(doc)
        if verdict is None:
            raise self._unavailable("the master has not answered its reports yet")
        # As the master does: a member that passed waits for the verdict to land or fail.
        quiet = report.passed and not verdict.verified and not verdict.failures
        if verdict.version != report.seen and not quiet:
            return verdict
        await wait_until(
            lambda: self.verdict is not verdict, lambda: self._verdict_changed, long_poll_s
        )
        return self.verdict or verdict

    def status(self) -> dict[str, object]:
        """The relay's state for /status."""
        return {
            "ranks": [self.ranks.start, self.ranks.stop - 1] if self.ranks else [],
            "joined": len(self.members),
            "waiting_to_send": len(self._unsent),
            "batches_sent": self.upstream.batches_sent,
            "generation": None if self.doc is None else self.doc.generation,
            "verdict_version": None if self.verdict is None else self.verdict.version,
            "problem": self.upstream.problem,
        }

    # -- the batches ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Send the group's joins and reports to the master in batches until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._send_joins())
            group.create_task(self._send_reports())

    async def close(self) -> None:
        """Cancel the pokes in flight; closing twice is safe."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _send_joins(self) -> None:
        spec = self.ctx.spec
        while True:
            await self._joins_due.wait()
            await self._upstream_known.wait()
            await coalesce(
                self._joins_due, lambda: len(self.members) == len(self.ranks), COALESCE_S
            )
            self._joins_due.clear()
            batch, self._unsent = self._unsent, {}
            waiters = {rank: self._join_waiters.pop(rank, []) for rank in batch}
            members = [batch[rank] for rank in sorted(batch)]
            for chunk in wirebatch.chunks(members, _member_size):
                body = wirebatch.encode_join_batch(
                    wirebatch.JoinBatch(spec.session, spec.rank, tuple(chunk))
                )
                outcome = await self.upstream.call(
                    routes.JOINS.path, self.upstream.post_joins(body)
                )
                for member in chunk:
                    for waiter in waiters.get(member.rank, []):
                        if waiter.done():
                            continue
                        if isinstance(outcome, wire.JoinAnswer):
                            waiter.set_result(outcome)
                        else:
                            waiter.set_exception(outcome or self._unavailable("interrupted"))
                if not isinstance(outcome, wire.JoinAnswer):
                    # Those members are told to go direct; the master still hears of them
                    # here later (the same facts again are harmless to it).
                    for member in chunk:
                        self._unsent.setdefault(member.rank, member)
                        self._turned_away.add(member.rank)

    async def _send_reports(self) -> None:
        settings = self.ctx.settings
        backoff = Pause(
            Backoff(settings.backoff_initial_s, settings.backoff_max_s, rng=self.ctx.rng)
        )
        while True:
            doc, verdict = self.doc, self.verdict
            if doc is None or (not self._unsent_reports and (verdict is None or verdict.verified)):
                await self._reports_due.wait()
                self._reports_due.clear()
                continue
            await coalesce(
                self._reports_due, functools.partial(self._all_reported, doc), COALESCE_S
            )
            self._reports_due.clear()
            if self.doc is not doc:
                continue
            batch, self._unsent_reports = self._unsent_reports, {}
            items = [batch[rank] for rank in sorted(batch)]
            chunks = list(wirebatch.chunks(items, _report_size)) or [[]]
            for index, chunk in enumerate(chunks):
                body = self._report_batch(doc, chunk, hold=index == len(chunks) - 1)
                outcome = await self.upstream.call(
                    routes.REPORTS.path,
                    self.upstream.post_reports(body),
                    interrupt=self._reports_due,
                )
                if isinstance(outcome, wire.Verdict):
                    backoff.reset()
                    if outcome.generation == doc.generation and self.doc is doc:
                        self._set_verdict(outcome)
                    continue
                if isinstance(outcome, JoinRejected) and outcome.code == "stale_generation":
                    # A new document is on its way to this node: the reports of the old one
                    # are void, and asking again before it arrives would only be refused.
                    await backoff.sleep()
                    break
                # Interrupted (new reports, a new document) or failed: send them again.
                for report in chunk:
                    self._unsent_reports.setdefault(report.rank, report)
                if outcome is not None:
                    await backoff.sleep()
                break

    def _report_batch(self, doc: ClusterDoc, chunk: list[wire.Report], *, hold: bool) -> bytes:
        """A batch of the group's reports on ``doc``, naming the verdict version we hold."""
        spec, current = self.ctx.spec, self._current_verdict(doc)
        return wirebatch.encode_report_batch(
            wirebatch.ReportBatch(
                session=spec.session,
                generation=doc.generation,
                relay=spec.rank,
                reports=tuple(chunk),
                seen=-1 if current is None else current.version,
                hold=hold,
            )
        )

    # -- helpers -------------------------------------------------------------------------------

    def _check(self, session: str, rank: int, host: str) -> None:
        spec = self.ctx.spec
        if session != spec.session:
            raise JoinRejected(
                409,
                "session_mismatch",
                f"session {session!r}, but this relay serves {spec.session!r}",
            )
        if rank not in self.ranks:
            raise JoinRejected(
                409,
                "not_relay",
                f"{spec.host} relays for ranks {self.ranks.start}-{self.ranks.stop - 1}, not "
                f"{rank}; join the master {spec.master}",
            )
        if host.lower() != spec.hosts[rank].lower():
            raise JoinRejected(
                403,
                "impostor",
                f"host {host!r} claims rank {rank}, which the spec gives to {spec.hosts[rank]!r}",
            )

    def _unavailable(self, why: str) -> JoinRejected:
        return JoinRejected(
            503,
            "relay_unavailable",
            f"the relay {self.ctx.spec.host} cannot answer: {why}; join the master directly",
        )

    def _all_reported(self, doc: ClusterDoc) -> bool:
        """Every member reported on ``doc`` (or a newer document came): time to send."""
        return self.doc is not doc or all(rank in self.reports for rank in self.ranks)

    def _current_verdict(self, doc: ClusterDoc) -> wire.Verdict | None:
        verdict = self.verdict
        return verdict if verdict is not None and verdict.generation == doc.generation else None

    def _set_doc(self, doc: ClusterDoc | None) -> None:
        self.doc = doc
        self.encoded_doc = None if doc is None else EncodedDoc.of(doc)
        self.reports, self._unsent_reports = {}, {}
        # Replace each event, then set the old one: every waiter wakes exactly once.
        changed, self._doc_changed = self._doc_changed, asyncio.Event()
        changed.set()
        self._set_verdict(None)
        self._reports_due.set()

    def _set_verdict(self, verdict: wire.Verdict | None) -> None:
        self.verdict = verdict
        changed, self._verdict_changed = self._verdict_changed, asyncio.Event()
        changed.set()

    def _poke(self, ranks: Iterable[int]) -> None:
        if self.epoch is None:
            return
        for rank in ranks:
            task = asyncio.create_task(self._send_poke(self.ctx.spec.hosts[rank], self.epoch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
