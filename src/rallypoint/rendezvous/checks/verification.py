"""Each cluster document on this node, through one pipeline of steps to ready.

Per generation: names and env (namecheck.py) -> connections (connectivity.Connections) ->
the report and the master's verdict (clustercheck.py) -> ready. Each step hands the next its
outcome; this module only starts the pipeline for a document and restarts it. A new
generation turns the node not ready until the verdict says every node passed; a failure is
judged again after a pause, on a poke or on a re-join, so a fixed name turns the cluster
ready without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from rallypoint import wire
from rallypoint.model import ClusterDoc, OverrideSource
from rallypoint.reasons import Reason
from rallypoint.rendezvous.checks.clustercheck import GenerationCheck
from rallypoint.rendezvous.checks.connectivity import Connections
from rallypoint.rendezvous.checks.namecheck import NameCheck
from rallypoint.rendezvous.checks.prober import Prober
from rallypoint.rendezvous.checks.probewindows import Windows
from rallypoint.rendezvous.cluster.masterbook import MasterBook, Transport
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.tasks import cancel_quietly

#: Seconds between tries to open a window the last job's listener kept busy.
REOPEN_S = 0.5

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")


class Verification:
    """This node's verification of the current cluster document, up to ready."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        user: Mapping[str, tuple[str, OverrideSource]],
        transport: Transport,
        book: MasterBook | None,
        windows: Windows | None,
        prober: Prober | None,
        on_generation: list[Callable[[ClusterDoc], None]],
    ) -> None:
        self.ctx = ctx
        self.book = book
        self.windows = windows
        self._prober = prober
        self._transport = transport
        self._on_generation = on_generation
        self._names = NameCheck(ctx, user=user)
        self.doc: ClusterDoc | None = None
        #: The current generation's checks and the master's verdict on them.
        self.check: GenerationCheck | None = None
        self._verify_task: asyncio.Task[None] | None = None
        self._last_generation: str | None = None
        #: The generation the on_generation callbacks last ran for.
        self._announced: str | None = None

    @property
    def generation(self) -> str | None:
        """The current document's generation, None without one."""
        return None if self.doc is None else self.doc.generation

    @property
    def net(self) -> wire.NetFacts:
        """The route to the master, its MTU and RDMA, as the last name check found them."""
        return wire.NetFacts() if self.check is None else self.check.net

    async def close(self) -> None:
        """Cancel the verification in flight; closing twice is safe."""
        task = self._verify_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def accept(self, doc: ClusterDoc) -> None:
        """Act on a new cluster document: not ready until it is verified."""
        if self._last_generation is not None and self._last_generation != doc.generation:
            self.ctx.metrics.generation_changes.inc()
            if self.ctx.readiness.ready:
                self.ctx.readiness.restart_deadline()
        self._last_generation = doc.generation
        self.doc = doc
        self.ctx.peers.listed(doc.members)
        log.info("cluster_document", extra={"generation": doc.generation})
        self._start_verification(doc)

    def lose_generation(self, reason: Reason) -> None:
        """Drop the current document (the master restarted) and restart the deadline."""
        if self._verify_task is not None:
            self._verify_task.cancel()
        self.doc = None
        self.ctx.readiness.restart_deadline()
        self.ctx.readiness.not_ready(reason)

    def recheck(self, host: str) -> None:
        """A known worker joined again: retry a verification that gave up or waits on it."""
        task, doc, book = self._verify_task, self.doc, self.book
        if self.ctx.readiness.ready or doc is None or task is None or book is None:
            return
        if doc is not book.doc:
            return  # a newer document is on its way through run()
        verdict = book.verdict.current
        if verdict is not None and verdict.verified:
            return  # the others turn ready on it and close their windows: checked already
        if task.done() or waits_on(self.ctx.readiness.phase, host, self.ctx.spec.rank):
            log.info("verification_retry", extra={"trigger": "join", "host": host})
            self._start_verification(doc)

    def retry(self) -> None:
        """Retry a verification that gave up (the master poked us)."""
        task = self._verify_task
        if (
            self.doc is not None
            and not self.ctx.readiness.ready
            and task is not None
            and task.done()
        ):
            self._start_verification(self.doc)

    def _start_verification(self, doc: ClusterDoc) -> None:
        if self._verify_task is not None:
            self._verify_task.cancel()
        self.ctx.readiness.not_ready(
            Reason("verifying", f"verifying peer names for generation {doc.generation}")
        )
        self._verify_task = asyncio.create_task(self._verify(doc))

    async def _verify(self, doc: ClusterDoc) -> None:
        """The pipeline: names and env, connections, the master's verdict; then ready."""
        check = self._new_check(doc)
        ctx = self.ctx
        connections = Connections(
            self._prober,
            ctx.spec,
            doc,
            peers=ctx.peers,
            frameworks=ctx.settings.frameworks,
            report=check,
        )
        windows = self.windows
        if windows is not None:
            await windows.open()  # after a ready generation they were closed
        follow = asyncio.create_task(check.follow())
        reopening = None if windows is None else asyncio.create_task(_reopen(windows))
        try:
            env = await self._names.until_passed(doc, check, connections)
            connections.start()
            verdict = await follow
            if self.book is None:  # the master reads its book's verdict (node.py)
                ctx.readiness.verify_warnings += list(verdict.warnings)
            if self.windows is not None:
                # Before ready: the job's own listeners must find the held ports free to bind.
                await self.windows.close()
            ctx.readiness.become_ready(env, doc.generation)
            self._announce(doc)
        finally:
            await cancel_quietly(reopening)
            await connections.close()
            await cancel_quietly(follow)

    def _new_check(self, doc: ClusterDoc) -> GenerationCheck:
        """The checks of ``doc`` and the master's verdict on them, now the current ones."""
        windows = self.windows
        check = GenerationCheck(
            self.ctx.readiness,
            self.ctx.spec,
            doc,
            self.ctx.settings,
            self._transport,
            net=self.net,
            busy=lambda: frozenset() if windows is None else windows.busy,
            rng=self.ctx.rng,
            announce=lambda: self._announce(doc),
        )
        self.check = check
        return check

    def _announce(self, doc: ClusterDoc) -> None:
        """Run the on_generation callbacks (the mDNS re-announce) once per generation.

        Not on arrival: a master announcing before its document reached a worker over HTTP
        made that worker re-join for a document it was about to get, and N announcements
        made N x N mDNS receptions compete with the checks for CPU. A worker announces once
        ready or once a failure was reported (its announcement only shows in `rallypoint
        peers`); the master once its own checks settled (its first round of probes, or a
        failure reported), since its announcement also wakes a worker that is outside its
        long-poll and missed the poke.
        """
        if self._announced == doc.generation:
            return
        self._announced = doc.generation
        for callback in self._on_generation:
            try:
                callback(doc)
            except Exception:
                log.exception("generation_callback_failed")


async def _reopen(windows: Windows) -> None:
    """While a window is busy with the last job's listener, open it once the job lets the
    port go: a job stopped while this generation is checked, the peers' probes there are
    refused until then (and retried)."""
    while windows.busy:
        await asyncio.sleep(REOPEN_S)
        await windows.reopen_busy()


def waits_on(phase: Sequence[Reason], host: str, rank: int) -> bool:
    """Whether node ``rank``'s own checks wait on ``host``: a reason names it, other than a
    failure between two other nodes (their report: checking again here cannot mend it)."""
    return any(r.host == host and not (len(r.ranks) == 2 and rank not in r.ranks) for r in phase)
