"""Each cluster document on this node: check names, derive the env, try connections, then ready.

A new generation turns the node not ready until its document is verified here and the master's
verdict says every node passed (clustercheck.py); a failure is judged again after a pause, on a
poke or on a re-join, so a fixed name turns the cluster ready without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence

from rallypoint import wire
from rallypoint.core.backoff import Backoff
from rallypoint.core.names import Resolution
from rallypoint.model import ClusterDoc, Env, OverrideSource
from rallypoint.net.probe import Outcome
from rallypoint.reasons import Reason
from rallypoint.rendezvous import connectivity
from rallypoint.rendezvous.clustercheck import GenerationCheck, Transport, cancel_quietly
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.masterbook import MasterBook
from rallypoint.rendezvous.namecheck import NameCheck

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")

#: A node whose names or env failed judges them again after about this long.
RECHECK_S = 2.0

#: A probe started ahead of the others (its peer's name passed first).
Probing = asyncio.Task[Outcome]


class Verification:
    """This node's verification of the current cluster document, up to ready."""

    def __init__(
        self,
        ctx: NodeContext,
        *,
        user: Mapping[str, tuple[str, OverrideSource]],
        transport: Transport,
        book: MasterBook | None,
        windows: connectivity.Windows | None,
        prober: connectivity.Prober | None,
        on_generation: list[Callable[[ClusterDoc], None]],
    ) -> None:
        self.ctx = ctx
        self.book = book
        self.windows = windows
        self._prober = prober
        self._transport = transport
        self._on_generation = on_generation
        self._names = NameCheck(
            ctx,
            user=user,
            on_peer_failure=self._show_peer_failure,
            on_peer_passed=self._probe_early,
        )
        self.doc: ClusterDoc | None = None
        #: The current generation's checks and the master's verdict on them.
        self.check: GenerationCheck | None = None
        #: Probes started for ``check`` as each peer's name passed (see _probe_early).
        self._early: tuple[GenerationCheck | None, dict[connectivity.Target, Probing]] = (None, {})
        self.net = wire.NetFacts()
        self._verify_task: asyncio.Task[None] | None = None
        self._last_generation: str | None = None
        #: The generation the on_generation callbacks last ran for.
        self._announced: str | None = None

    @property
    def generation(self) -> str | None:
        """The current document's generation, None without one."""
        return None if self.doc is None else self.doc.generation

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
        task, doc = self._verify_task, self.doc
        if self.ctx.readiness.ready or doc is None or task is None or self.book is None:
            return
        if doc is not self.book.doc:
            return  # a newer document is on its way through run()
        if task.done() or any(r.host == host for r in self.ctx.readiness.phase):
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
        self._verify_task = asyncio.create_task(self._verify_and_derive(doc))

    async def _verify_and_derive(self, doc: ClusterDoc) -> None:
        """Names, env, connections, then the master's cluster-wide verdict: ready."""
        windows = self.windows
        check = self._new_check(doc, windows)
        early: dict[connectivity.Target, Probing] = {}
        self._early = (check, early)
        if windows is not None:
            await windows.open()  # after a ready generation they were closed
        follow = asyncio.create_task(check.follow())
        probes: asyncio.Task[None] | None = None
        try:
            env = await self._names_and_env(doc, check, early)
            probes = self._try_connections(doc, check, early)
            verdict = await follow
            self.ctx.readiness.verify_warnings += list(verdict.warnings)
            if windows is not None:
                # Before ready: the job's own listeners must find the held ports free to bind.
                await windows.close()
            self.ctx.readiness.become_ready(env, doc.generation)
            self._announce(doc)
        finally:
            _cancel(early)
            await cancel_quietly(probes)
            await cancel_quietly(follow)

    def _new_check(self, doc: ClusterDoc, windows: connectivity.Windows | None) -> GenerationCheck:
        """The checks of ``doc`` and the master's verdict on them, now the current ones."""
        check = GenerationCheck(
            self.ctx.readiness,
            self.ctx.spec,
            doc,
            self.ctx.settings,
            self._transport,
            net=self.net,
            busy=lambda: frozenset() if windows is None else windows.busy,
            rng=self.ctx.rng,
        )
        self.check = check
        return check

    async def _names_and_env(
        self, doc: ClusterDoc, check: GenerationCheck, early: dict[connectivity.Target, Probing]
    ) -> Env:
        """Check the names and derive the env until both pass, reporting each failure."""
        # A steady pause between half and all of RECHECK_S, so nodes do not judge in lockstep.
        recheck = Backoff(RECHECK_S, RECHECK_S, jitter="half", rng=self.ctx.rng)
        while True:
            _cancel(early)
            checked = await self._names.check(doc)
            log.debug("names_checked", extra={"failures": len(checked.failures)})
            self.ctx.readiness.verify_warnings = [checked.warning] if checked.warning else []
            self.net = check.net = checked.net
            outcome: Env | Reason = (
                checked.failures[0] if checked.failures else self._names.derive(doc, checked)
            )
            if not isinstance(outcome, Reason):
                return outcome
            # Tell the master (every node shows it), then judge again after a pause: a
            # fixed /etc/hosts entry or a late DNS record turns the cluster ready
            # without a restart (a poke or a re-join retries at once).
            check.update(checked.failures or [outcome])
            await check.reported(self.ctx.settings.resolve_timeout_s)
            self._announce(doc)
            await recheck.sleep()

    def _try_connections(
        self, doc: ClusterDoc, check: GenerationCheck, early: dict[connectivity.Target, Probing]
    ) -> asyncio.Task[None] | None:
        """Start trying the connections the job will make; with no prober, this node passed."""
        if self._prober is None:
            check.update([], passed=True)
            if self.book is not None:
                self._announce(doc)
            return None
        targets = self._targets(doc)
        check.update([Reason("verifying", f"trying {len(targets)} connections the job will make")])
        return asyncio.create_task(
            self._prober.run(targets, lambda failed: self._probed(check, failed), started=early)
        )

    def _probed(self, check: GenerationCheck, failed: list[Reason]) -> None:
        """A round of probes ended: show and report what failed, or that this node passed."""
        log.debug("probes_done", extra={"failed": len(failed)})
        links = None if self._prober is None else list(self._prober.links.values())
        check.update(failed, passed=not failed, links=links)
        if self.book is not None or failed:
            self._announce(check.doc)  # see _announce: when a node announces a generation

    def _probe_early(self, doc: ClusterDoc, rank: int, res: Resolution) -> None:
        """A peer's name passed: try its connections now, while other names are checked.

        The outcomes count only once every name passed and the env derived (the first round
        of Prober.run takes them): the same targets as _targets() gives then, since both pick
        the address from the same resolution.
        """
        check, early = self._early
        if self._prober is None or check is None or check is not self.check or check.doc is not doc:
            return
        address = connectivity.pick_address(res.addresses, doc.members[rank].addresses)
        if address is None:
            return
        for target in self._plan(doc, [rank], {rank: address}):
            if target not in early:
                early[target] = self._prober.start(target)

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

    def _targets(self, doc: ClusterDoc) -> list[connectivity.Target]:
        """The connections to try for ``doc``: the master port and the peers in scope."""
        ranks = self.ctx.peers.in_scope()
        addresses = connectivity.verified_addresses(
            doc, ranks, {rank: self.ctx.peers[rank].resolution for rank in ranks}
        )
        return self._plan(doc, ranks, addresses)

    def _plan(
        self, doc: ClusterDoc, ranks: Sequence[int], addresses: Mapping[int, str]
    ) -> list[connectivity.Target]:
        frameworks = self.ctx.settings.frameworks
        return connectivity.plan(
            self.ctx.spec, doc, ranks, addresses, tf="tf" in frameworks, jax="jax" in frameworks
        )

    def _show_peer_failure(self, doc: ClusterDoc, host: str, reason: Reason) -> None:
        """A peer's first check failed: show and report it now, unless the document moved on."""
        check = self.check
        if (
            not self.ctx.readiness.ready
            and self.doc is doc
            and check is not None
            and check.doc is doc
        ):
            current = [r for r in check.local if r.code != "verifying" and r.host != host]
            check.update([*current, reason])


def _cancel(early: dict[connectivity.Target, Probing]) -> None:
    """Drop the probes started ahead: the names they were started on are checked again."""
    for task in early.values():
        task.cancel()
    early.clear()
