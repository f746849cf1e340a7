"""The worker's side: join the master with capped jittered backoff, then long-poll its document."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from rallypoint import wire
from rallypoint.core import fanout, names
from rallypoint.core.backoff import Backoff
from rallypoint.core.clock import skew_reason
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.model import ClusterDoc, Member
from rallypoint.net import resolve
from rallypoint.net.pause import Pause
from rallypoint.reasons import Reason, auth_reason
from rallypoint.rendezvous.cluster.relay import Relay
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.tasks import unless_set

# The rendezvous logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.rendezvous")


#: For this long after start a member whose relay does not answer yet waits for it rather
#: than going around it (sidecars of one job start within about a second of each other).
RELAY_GRACE_S = 2.0
#: The longest a member waits for its relay to accept the connection. A relay's listener
#: answers a SYN at once (the kernel completes the handshake, whatever its loop is doing), so
#: a relay that takes longer is down or filtered, and the master takes the join instead;
#: without the cap a member behind a filtered relay paid --resolve-timeout at every poke.
RELAY_CONNECT_S = 1.0


#: Where a join was accepted (the peer API's address), and the answer.
Joined = tuple[tuple[str, int], wire.JoinAnswer]


class _Rejoin(Exception):
    """The long-poll ended in a way that calls for a new join (poke, lost connection)."""


class WorkerNode(Protocol):
    """What the join loop reports to the node it runs for (the Rendezvous)."""

    master_target: tuple[str, int] | None

    def accept(self, doc: ClusterDoc) -> None: ...


class Documents(Protocol):
    """The node's current document as the join loop reads and drops it (the verification)."""

    @property
    def doc(self) -> ClusterDoc | None: ...

    def lose_generation(self, reason: Reason) -> None: ...


class Worker:
    """One worker's join loop: join, long-poll, re-join on a poke, a lost master or a restart."""

    def __init__(
        self,
        node: WorkerNode,
        ctx: NodeContext,
        *,
        documents: Documents,
        poked: asyncio.Event,
        on_joined: Callable[[tuple[str, int], wire.JoinAnswer], None] | None = None,
    ) -> None:
        self.node = node
        self.ctx = ctx
        self.documents = documents
        self._poked = poked
        #: Told of every accepted join of the master (a relay sends its batches there).
        self._on_joined = on_joined
        spec = ctx.spec
        relay = fanout.relay_of(
            spec.rank, fanout.group_size(spec.nnodes, ctx.settings.relay_group_size)
        )
        #: The relay this worker joins through first (core/fanout.py), None: the master directly.
        self.relay = None if relay is None else spec.hosts[relay]
        #: Set when the relay failed us: join the master directly until the next poke.
        self._skip_relay = False
        self._started = ctx.clock()
        #: Why the master's last cluster document was refused (forged, tampered, invalid);
        #: kept as the reason until a valid document arrives, so re-joins do not hide it.
        self._refused: Reason | None = None

    async def run(self, own: Member) -> None:
        """Join as ``own`` and follow the master's documents until cancelled."""
        master = self.ctx.spec.master
        self.ctx.readiness.not_ready(
            Reason("waiting_for_master", f"joining the master {master}", host=master)
        )
        # Full jitter, and a poke (the master came up, a new generation) ends the pause.
        settings = self.ctx.settings
        backoff = Pause(
            Backoff(settings.backoff_initial_s, settings.backoff_max_s, rng=self.ctx.rng),
            wake=self._poked,
        )
        epoch: str | None = None
        after: str | None = None
        while True:
            target, answer = await self._join(own, after, backoff)
            self.node.master_target = target
            backoff.reset()
            if epoch is not None and answer.epoch != epoch:
                log.warning(
                    "master_restarted", extra={"old_epoch": epoch, "new_epoch": answer.epoch}
                )
                self.documents.lose_generation(
                    Reason(
                        "generation_changed",
                        f"the master {master} restarted; waiting for its new cluster document",
                        host=master,
                    )
                )
            epoch = answer.epoch
            if self.documents.doc is None and self._refused is not None:
                self.ctx.readiness.not_ready(self._refused)
            elif self.documents.doc is None:
                self.ctx.readiness.not_ready(
                    Reason(
                        "waiting_for_cluster",
                        f"joined {master} as rank {self.ctx.spec.rank}; {answer.joined} of "
                        f"{answer.nnodes} nodes joined so far",
                        host=master,
                    )
                )
            while True:
                try:
                    doc = await self._poll(target, after)
                except _Rejoin:
                    break
                if doc is None:
                    continue
                problem = self._foreign(doc)
                if problem is not None:
                    self.ctx.readiness.not_ready(problem)
                    after = doc.generation
                    continue
                if doc.members[self.ctx.spec.rank] != own:
                    break  # the master holds stale facts about us (we restarted): re-join
                after = doc.generation
                self._refused = None
                self.node.accept(doc)

    async def _join(self, own: Member, after: str | None, backoff: Pause) -> Joined:
        """Join through our relay, else the master, until one accepts: where, and its answer."""
        body = wire.encode_join(wire.JoinRequest(self.ctx.spec.session, own, after))
        while True:
            if self.relay is not None and not self._skip_relay:
                joined, unreachable = await self._join_relay(self.relay, body)
                if joined is not None:
                    return joined
                if unreachable and self.ctx.clock() - self._started < RELAY_GRACE_S:
                    # Started together with our relay, which may not listen yet: a member
                    # going around it now would leave it to the master for the session.
                    await backoff.sleep()
                    continue
                self._skip_relay = True
            outcome = await self._join_master(body)
            if not isinstance(outcome, Reason):
                return outcome
            self.ctx.metrics.join_attempts.labels(outcome.code).inc()
            if self.ctx.readiness.ready:
                self.ctx.readiness.master_problem = outcome
            else:
                self.ctx.readiness.not_ready(outcome)
            if await backoff.sleep():
                self._skip_relay = False  # poked: the relay may be back

    async def _join_master(self, body: bytes) -> Joined | Reason:
        """Resolve the master and join it at each of its addresses: where and its answer, or
        why none accepted."""
        master = self.ctx.spec.master
        res = await resolve.check(
            self.ctx.resolver, master, None, timeout_s=self.ctx.settings.resolve_timeout_s
        )
        self.ctx.metrics.resolutions.labels(str(res.verdict)).inc()
        accept = self.ctx.accept_loopback
        problem = names.master_reason(res, accept_loopback=accept)
        excused = None if problem else names.why_acceptable(res, accept_loopback=accept)
        self.ctx.peers.resolved(0, res, excused=excused)
        if problem is not None:
            return problem
        problem = Reason("master_unreachable", f"no address of {master}", host=master)
        for address in res.addresses:
            target = self.ctx.endpoint(master, address)
            try:
                answer = await self.ctx.client.post_join(target, body, self.ctx.spec.session)
            except PeerDown as exc:
                problem = Reason(
                    "master_unreachable",
                    f"cannot reach the master {master}'s peer API at {address}: "
                    "is its sidecar running and the peer port open?",
                    host=master,
                    detail=str(exc),
                )
                continue
            except JoinRejected as exc:
                return Reason("join_rejected", str(exc), host=master, detail=exc.code)
            except AuthError as exc:
                self.ctx.metrics.auth_failures.labels(auth_reason(exc)).inc()
                return self._auth_reason(exc)
            except PeerMessageError as exc:
                return Reason(
                    "master_answer_invalid", f"the master's join answer: {exc}", host=master
                )
            self.ctx.metrics.join_attempts.labels("accepted").inc()
            self.ctx.readiness.master_problem = None
            if self._on_joined is not None:
                self._on_joined(target, answer)
            return target, answer
        return problem

    async def _join_relay(self, relay: str, body: bytes) -> tuple[Joined | None, bool]:
        """Join through our relay: (where and its answer, or None when it cannot answer;
        whether it was only unreachable rather than refusing)."""
        res = await resolve.check(
            self.ctx.resolver, relay, None, timeout_s=self.ctx.settings.resolve_timeout_s
        )
        if names.dials_self(res, accept_loopback=self.ctx.accept_loopback):
            return None, False
        unreachable = bool(res.addresses)
        for address in res.addresses:
            target = self.ctx.endpoint(relay, address)
            try:
                answer = await self.ctx.client.post_join(
                    target,
                    body,
                    self.ctx.spec.session,
                    connect_s=min(RELAY_CONNECT_S, self.ctx.settings.resolve_timeout_s),
                )
            except (PeerDown, JoinRejected, AuthError, PeerMessageError) as exc:
                unreachable = unreachable and isinstance(exc, PeerDown)
                log.info("relay_skipped", extra={"relay": relay, "error": str(exc)})
                continue
            self.ctx.metrics.join_attempts.labels("accepted").inc()
            self.ctx.readiness.master_problem = None
            return (target, answer), False
        return None, unreachable

    async def _poll(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        """One long-poll; the document, None on timeout, _Rejoin on a poke or lost master."""
        poll = await unless_set(self.ctx.client.get_cluster(target, after), self._poked)
        if poll.cancelled():
            self._poked.clear()
            self._skip_relay = False  # poked: the relay may be back
            raise _Rejoin("poked")
        try:
            return poll.result()
        except (PeerDown, JoinRejected) as exc:
            log.info("master_lost", extra={"master": self.ctx.spec.master, "error": str(exc)})
            raise _Rejoin(str(exc)) from exc
        except AuthError as exc:
            self.ctx.metrics.auth_failures.labels(auth_reason(exc)).inc()
            self._refused = self._auth_reason(exc)
            self.ctx.readiness.not_ready(self._refused)
            raise _Rejoin(str(exc)) from exc
        except PeerMessageError as exc:
            self._refused = Reason(
                "master_answer_invalid", f"cluster document: {exc}", host=self.ctx.spec.master
            )
            self.ctx.readiness.not_ready(self._refused)
            raise _Rejoin(str(exc)) from exc

    def _auth_reason(self, exc: AuthError) -> Reason:
        """auth_failed, or clock_skew when the master's message or ours was refused for its
        timestamp alone (the client already corrected and retried once, core/clock.py)."""
        master = self.ctx.spec.master
        if exc.skew_s is None:
            return Reason("auth_failed", str(exc), host=master)
        client = self.ctx.client
        return skew_reason(
            master,
            exc.skew_s,
            client.auth.max_skew_s,
            client.offsets.facts(),
            by_peer=exc.reason == "refused",
        )

    def _foreign(self, doc: ClusterDoc) -> Reason | None:
        """Why a document does not describe our session's spec, or None."""
        hosts = tuple(m.host.lower() for m in doc.members)
        if doc.session != self.ctx.spec.session or hosts != tuple(
            h.lower() for h in self.ctx.spec.hosts
        ):
            return Reason(
                "spec_mismatch",
                f"the master's cluster document lists {len(hosts)} hosts for session "
                f"{doc.session!r}, which differs from this node's spec; give every node the "
                "same node list",
                host=self.ctx.spec.master,
            )
        return None


async def run_worker(
    node: WorkerNode,
    ctx: NodeContext,
    own: Member,
    *,
    documents: Documents,
    poked: asyncio.Event,
    relay: Relay | None,
) -> None:
    """Join as ``own`` and follow the master until cancelled; beside it, serve ``relay``'s
    group when this node relays for one (it sends its batches where the join was accepted)."""
    on_joined = None if relay is None else relay.upstream_joined
    worker = Worker(node, ctx, documents=documents, poked=poked, on_joined=on_joined)
    if relay is None:
        await worker.run(own)
        return
    async with asyncio.TaskGroup() as group:
        group.create_task(worker.run(own))
        group.create_task(relay.run())
