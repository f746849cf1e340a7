"""After ready, the nodes keep each other alive, and a node that stops answering is named.

Traffic is bounded the way the rendezvous is: each worker sends one keep-alive per interval
to its upstream (its relay in a fan-out tree, else the master; the master too while the relay
fails it), and a relay passes on how long ago it heard each member of its group. So the
master handles O(N) small requests per interval without a tree, O(N / group) with one. The
master checks a rank that went silent itself (a keep-alive of its own), which tells why:
refused, timed out or unreachable. Every answer names what its sender finds down, so each
node learns within an interval what the master found (core/liveness.py). What is served does not
change: the job owns what happens next (docs/readiness.md "After ready").

The keep-alives also carry the supervised job's states and its first failure (jobwatch.py):
a change on this node is sent at once instead of at the next interval, and the master (a
relay, for its group) pushes a new first failure down at once. A node whose `run` reported
keeps alive even before it is ready (its sidecar restarted while the job runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from rallypoint.core import fanout, names
from rallypoint.core.jobs import JobState, JobStatus
from rallypoint.core.liveness import Down, Watch, aged, warning
from rallypoint.core.progress import Mark
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.net import resolve
from rallypoint.rendezvous.afterready.jobwatch import JobWatch
from rallypoint.rendezvous.afterready.progresswatch import ProgressWatch
from rallypoint.rendezvous.context import NodeContext
from rallypoint.wire import alive as wirealive

log = logging.getLogger("rallypoint.rendezvous")

#: Most silent ranks the master checks at once in one interval (the rest wait their turn).
MAX_CHECKS = 32
#: Most nodes named down one by one in the warnings.
WARNED = 8
#: Most keep-alives a push of the first failure has in flight at once.
MAX_PUSHES = 64
#: Up to this many nodes the nodes a node watches have a rallypoint_peer_up series; above,
#: only the nodes named down (a healthy 4096-node master exports none).
GAUGE_ALL_NODES = 256


class Keepalive:
    """One node's keep-alive loop and its answers to others' keep-alives."""

    def __init__(
        self, ctx: NodeContext, watch: Watch, jobs: JobWatch, progress: ProgressWatch
    ) -> None:
        self.ctx = ctx
        self.watch = watch
        self.jobs = jobs
        self.progress = progress
        spec = ctx.spec
        self.size = fanout.group_size(spec.nnodes, ctx.settings.relay_group_size)
        #: Our relay's rank (None: we talk to the master directly).
        self.relay = None if spec.is_master else fanout.relay_of(spec.rank, self.size)
        #: The ranks we relay for (empty unless we are a relay).
        self.group = tuple(fanout.group(spec.rank, self.size, spec.nnodes))
        #: Whether the last keep-alive built carried the earlier attempts' first failures.
        self._told_firsts = False
        #: The last verdict: every node it named down, and when it was taken (monotonic).
        self._named: dict[int, Down] = {}
        self._named_at = time.monotonic()
        #: The nodes the last verdict knew left.
        self._left: set[int] = set()
        #: The nodes with a rallypoint_peer_up series from here.
        self._gauged: frozenset[int] = frozenset()
        self._interval = watch.interval_s
        #: Set after each round of keep-alives: what they found is published now.
        self._heard_back = asyncio.Event()

    async def _started(self) -> bool:
        """Wait for this node's first ready, or its job's report; False when shutting down."""
        readiness = self.ctx.readiness
        while not self.jobs.reported.is_set():
            if await readiness.wait_ready(1.0, client=False):
                return True
            if readiness.shutting_down:
                return False  # never ready now: wait_ready would return at once, forever
        return True

    async def run(self) -> None:
        """Keep alive (from the first ready, or the job's report) until cancelled."""
        if not await self._started():
            return
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._keep())
            tasks.create_task(self._judge())
            tasks.create_task(self._pushes())

    async def _keep(self) -> None:
        spec = self.ctx.spec
        if spec.is_master:
            self.watch.track(r for r in range(spec.nnodes) if r != spec.rank)
        else:
            self.watch.track(self.group, upstream=[self._upstream()])
        log.info(
            "keepalive_started",
            extra={"interval_s": self._interval, "watched": len(self.watch.watched)},
        )
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            if spec.is_master:
                await self._check_silent()
            else:
                await self._beat()
            self._heard_back.set()
            pause = max(0.05, self._interval - (loop.time() - started))
            # A job change on this node goes up at once, not at the next interval.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self.jobs.send_up.wait()
            self.jobs.send_up.clear()

    async def _judge(self) -> None:
        """Publish what the watch finds: after each round of keep-alives, and the moment a
        silence reaches its bound (a keep-alive that times out does not hold the verdict
        back, and the upstream's one-interval lead over its members stays one interval)."""
        while True:
            await self._publish()
            due = self.watch.next_change_s()
            wait = self._interval if due is None else min(self._interval, due + 0.01)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._heard_back.wait()
            self._heard_back.clear()

    async def _pushes(self) -> None:
        """Push the first failure (and our own job's end) down as soon as they are known."""
        downstream = self._downstream()
        limit = asyncio.Semaphore(MAX_PUSHES)

        async def push(rank: int, body: bytes) -> None:
            async with limit:
                await self._send(rank, body, self._interval)

        while True:
            await self.jobs.send_down.wait()
            self.jobs.send_down.clear()
            if not self.jobs.push_due():
                continue
            alive = self.jobs.push_body()
            body = wirealive.encode_alive(alive)
            log.info(
                "job_push",
                extra={
                    "to": len(downstream),
                    "first": None if alive.first is None else alive.first.host,
                },
            )
            await asyncio.gather(*(push(r, body) for r in downstream))
            await self.jobs.pushed(alive)

    async def answer(self, alive: wirealive.Alive) -> wirealive.AliveAnswer:
        """A peer's keep-alive: note it (and a relay's ages of its group); our view back."""
        spec = self.ctx.spec
        if alive.session != spec.session:
            raise JoinRejected(
                409, "session_mismatch", f"keep-alive for session {alive.session!r}, not ours"
            )
        if alive.rank >= spec.nnodes or alive.host.lower() != spec.hosts[alive.rank].lower():
            raise JoinRejected(
                409,
                "spec_mismatch",
                f"keep-alive from {alive.host} as rank {alive.rank}, which this node's spec "
                "does not list; give every node the same node list",
            )
        group = fanout.group(alive.rank, self.size, spec.nnodes)
        if alive.leaving:
            self.watch.leave(alive.rank)
        else:
            self.watch.heard(alive.rank)
        for rank, age_s in alive.heard:
            if rank in group:
                self.watch.heard(rank, age_s)
        for rank in alive.left:
            if rank in group:
                self.watch.leave(rank)
        await self.jobs.from_peer(alive, upstream=alive.rank in (0, self.relay))
        self.progress.from_peer(alive)
        view = self.watch.view()
        down = wirealive.AliveAnswer(
            spec.session,
            spec.rank,
            tuple(view[: wirealive.MAX_DOWN]),
            len(view),
            progress=self.progress.summary(),
            left=tuple(self.watch.left())[: wirealive.MAX_DOWN],
        )
        return self.jobs.with_jobs(down, alive.jobs_seen)

    async def goodbye(self, timeout_s: float) -> None:
        """This sidecar stops on purpose: tell the nodes it keeps alive with (its upstream,
        and the ranks it pushes to), so that they show it as left, not lost. Not while its
        job still runs: then its node may be going down, and silence names it lost."""
        spec, own = self.ctx.spec, self.jobs.book.state(self.ctx.spec.rank)
        if own.state in (JobStatus.STARTING, JobStatus.RUNNING):
            log.info("goodbye_skipped", extra={"job": own.state})
            return
        upstream = [] if spec.is_master else [self._upstream()]
        alive = wirealive.Alive(
            spec.session,
            spec.rank,
            spec.host,
            job=None if own.state == JobStatus.WAITING else own,
            leaving=True,
            go=self.jobs.book.go,
        )
        body, limit = wirealive.encode_alive(alive), asyncio.Semaphore(MAX_PUSHES)
        targets = [*upstream, *self._downstream()]

        async def tell(rank: int) -> None:
            async with limit:
                await self._send(rank, body, timeout_s)

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(tell(r) for r in targets))
        log.info("goodbye_sent", extra={"to": len(targets)})

    def _downstream(self) -> list[int]:
        """The ranks this node pushes to: the master's direct ranks, a relay's group."""
        spec = self.ctx.spec
        if spec.is_master:
            return [r for r in range(1, spec.nnodes) if fanout.relay_of(r, self.size) is None]
        return list(self.group)

    def named(self) -> list[Down]:
        """The nodes the last verdict named down, aged to now: what /status shows, so that
        its down list, its warnings, the gauges and the log never disagree."""
        return aged(self._named.values(), time.monotonic() - self._named_at)

    def _upstream(self) -> int:
        return 0 if self.relay is None else self.relay

    def _body(self) -> tuple[bytes, tuple[JobState, ...], tuple[Mark, ...]]:
        """A keep-alive's body, and the group's job states and progress marks it carries."""
        spec = self.ctx.spec
        ages = tuple(self.watch.ages(self.group))
        own, changed, seen = self.jobs.outgoing(self.group)
        mark, marks = self.progress.outgoing(self.group)
        book = self.jobs.book  # earlier attempts' first failures, to an upstream that restarted
        firsts = [f for f in book.firsts() if f.attempt < book.go] if self.jobs.tell_firsts else []
        self._told_firsts = bool(firsts)
        alive = wirealive.Alive(
            spec.session,
            spec.rank,
            spec.host,
            ages,
            job=own,
            jobs=changed,
            jobs_seen=seen,
            go=self.jobs.book.go,
            firsts=tuple(firsts),
            mark=mark,
            marks=marks,
            left=tuple(r for r in self.watch.left() if r in self.group),
        )
        return wirealive.encode_alive(alive), changed, marks

    async def _beat(self) -> None:
        """A worker's keep-alive: to its relay, and to the master when the relay fails it."""
        body, changed, marks = self._body()
        if self.relay is not None:
            if await self._send(self.relay, body, self._interval / 2, upstream=True):
                self._sent(changed, marks)
                self.watch.track(self.group, upstream=[self.relay])
                return
            self.watch.track(self.group, upstream=[self.relay, 0])
        if await self._send(0, body, self._interval, upstream=True):
            self._sent(changed, marks)

    def _sent(self, changed: tuple[JobState, ...], marks: tuple[Mark, ...]) -> None:
        """The upstream took a keep-alive: its states and marks, and the first failures it
        carried."""
        self.jobs.sent(changed)
        self.progress.sent(marks)
        if self._told_firsts:
            self.jobs.tell_firsts = False

    async def _check_silent(self) -> None:
        """The master's own keep-alive to each rank gone silent: it comes back, or says why."""
        silent = self.watch.to_check()[:MAX_CHECKS]
        if silent:
            body, _, _ = self._body()
            await asyncio.gather(*(self._send(r, body, self._interval) for r in silent))

    async def _send(
        self, rank: int, body: bytes, timeout_s: float, *, upstream: bool = False
    ) -> bool:
        """One keep-alive to ``rank``; whether it answered (its view kept when ``upstream``)."""
        with self.watch.trying(rank):
            return await self._try(rank, body, timeout_s, upstream=upstream)

    async def _try(self, rank: int, body: bytes, timeout_s: float, *, upstream: bool) -> bool:
        ctx = self.ctx
        host = ctx.spec.hosts[rank]
        res = await resolve.check(
            ctx.resolver, host, None, timeout_s=min(ctx.settings.resolve_timeout_s, timeout_s)
        )
        if not res.addresses or names.dials_self(res, accept_loopback=ctx.accept_loopback):
            self.watch.failed(rank, "unreachable", f"{host}: {res.detail}")
            return False
        for address in res.addresses:
            target = ctx.endpoint(host, address)
            try:
                answer = await ctx.client.post_alive(target, body, timeout_s)
            except PeerDown as exc:
                self.watch.failed(rank, exc.cause, f"{target[0]}:{target[1]}: {exc}")
                continue
            except (JoinRejected, AuthError, PeerMessageError) as exc:
                self.watch.failed(rank, "failed", f"{target[0]}:{target[1]}: {exc}")
                continue
            self.watch.heard(rank)
            if upstream:
                self.watch.upstream(rank, answer.down, answer.left)
                self.progress.from_upstream(answer)
                await self.jobs.from_upstream(answer)
            return True
        return False

    async def _publish(self) -> None:
        """Log who went down or came back, set the warnings and gauges, name lost jobs."""
        view = {d.rank: d for d in self.watch.view()}
        if view:
            await self.jobs.lost(list(view.values()))
        metrics, spec = self.ctx.metrics, self.ctx.spec
        for rank, down in view.items():
            if rank not in self._named:
                log.warning(
                    "peer_down",
                    extra={
                        "rank": rank,
                        "host": down.host,
                        "cause": down.cause,
                        "detail": down.detail,
                        "seen_by": down.seen_by,
                        "silent_s": round(down.for_s, 1),
                    },
                )
        for rank, down in self._named.items():
            if rank not in view:
                log.info("peer_up", extra={"rank": rank, "host": down.host})
        left = self.watch.left()
        for rank in left.keys() - self._left:
            log.info("peer_left", extra={"rank": rank, "host": spec.hosts[rank]})
        self._left = set(left)
        # A series for each node this one watches (the master: every node; a relay: its group
        # and upstream; a worker: its upstream), above GAUGE_ALL_NODES nodes only those down:
        # O(N) cluster-wide. The nodes an upstream names down are its series, not this one's
        # (rallypoint_peers_down counts them). A node that left has none: no alert for it.
        watched = self.watch.watched
        if spec.nnodes > GAUGE_ALL_NODES:
            watched = watched & view.keys()
        shown = watched - left.keys() - {spec.rank}
        for rank in self._gauged - shown:
            metrics.peer_up.remove(spec.hosts[rank])
        for rank in shown:
            metrics.peer_up.labels(spec.hosts[rank]).set(0 if rank in view else 1)
        self._gauged = shown
        metrics.peers_down.set(len(view))
        metrics.peers_left.set(len(left))
        self._named, self._named_at = view, time.monotonic()

    def warnings(self) -> list[str]:
        """The nodes named down, for readiness's warnings (the env stays served meanwhile)."""
        down = list(self._named.values())
        more = [f"{len(down) - WARNED} more nodes are down"] if len(down) > WARNED else []
        return [warning(d) for d in down[:WARNED]] + more
