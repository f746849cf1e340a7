"""The rendezvous state machines: the master's join book, the worker's join loop, verification.

A star on the master (node rank 0). Workers resolve the master's name and POST /v1/join until
accepted, then long-poll GET /v1/cluster. Once every node joined, the master issues a cluster
document; every node verifies the peer names it needs, derives its env and turns ready. A new
generation (the master restarted, or a node re-joined with different facts) turns the node
not ready until the new document is verified. Readiness is always explained by Reasons with
stable codes (docs/readiness.md).

This module holds the node's state machine and composes its parts: reasons.py (why not
ready), masterbook.py (the master's join book), worker.py (the worker's join loop),
peerhttp.py (requests to other nodes) and verify.py (peer names and the derived env).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import TracebackType
from typing import Any

from rallypoint import connectivity, names, netinfo, probe, resolve, wire
from rallypoint.auth import Authenticator
from rallypoint.clustercheck import GenerationCheck, cancel_quietly, http_transport, local_transport
from rallypoint.masterbook import JoinRejected, MasterBook
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec, Env, Member, OverrideSource
from rallypoint.peerhttp import PeerClient, PeerDown
from rallypoint.ports import HeldPort
from rallypoint.reasons import Reason, auth_reason, discovering_reason
from rallypoint.resolve import Resolver
from rallypoint.settings import Settings
from rallypoint.verify import PeerState, Verifier, round_s
from rallypoint.worker import Backoff, PeerEndpoint, Worker

__all__ = [
    "POKE_TIMEOUT_S",
    "Backoff",
    "JoinRejected",
    "MasterBook",
    "PeerEndpoint",
    "PeerState",
    "Reason",
    "Rendezvous",
    "auth_reason",
    "discovering_reason",
]

log = logging.getLogger(__name__)

#: Pokes are best effort: a worker that does not answer this fast is not waited for.
POKE_TIMEOUT_S = 2.0
#: A node whose names or env failed judges them again after about this long.
RECHECK_S = 2.0


#: Above this many nodes each join is logged at debug, with an INFO line per tenth joined:
#: a line per join cost ~4 % of a 4096-node master's CPU and floods the log.
JOIN_LOG_ALL_NODES = 256


def _log_join(member: Member, remote: str | None, before: int, joined: int, nnodes: int) -> None:
    if nnodes <= JOIN_LOG_ALL_NODES:
        log.info("joined rank=%d host=%s remote=%s", member.rank, member.host, remote)
        return
    log.debug("joined rank=%d host=%s remote=%s", member.rank, member.host, remote)
    step = max(1, nnodes // 10)
    if joined != before and (joined // step != before // step or joined == nnodes):
        log.info("joins_progress joined=%d nnodes=%d", joined, nnodes)


class Rendezvous:
    """One node's side of the rendezvous, its readiness and everything /status shows."""

    def __init__(
        self,
        spec: ClusterSpec,
        settings: Settings,
        *,
        resolver: Resolver,
        auth: Authenticator,
        metrics: Metrics,
        addresses: Sequence[str],
        held: Mapping[str, HeldPort],
        user: Mapping[str, tuple[str, OverrideSource]],
        endpoint: PeerEndpoint | None = None,
        route: probe.ProbeRoute | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.resolver = resolver
        self.auth = auth
        self.metrics = metrics
        self.addresses = tuple(addresses)
        self.held = dict(held)
        self.user = dict(user)
        self._endpoint = endpoint or (lambda _host, address: (address, settings.peer_port))
        self._route = route or probe.direct
        #: Where the last accepted join reached the master's peer API (reports go there).
        self.master_target: tuple[str, int] | None = None
        self.windows: connectivity.Windows | None = None
        self._prober: connectivity.Prober | None = None
        #: The current generation's checks and the master's verdict on them.
        self.check: GenerationCheck | None = None
        self._net = wire.NetFacts()
        self._clock = clock
        self._rng = rng or random.Random()
        self.accept_loopback = spec.loopback_ok or settings.allow_loopback
        # Unique across master restarts: every generation this master issues starts with it.
        self.epoch = secrets.token_hex(6)
        self.book: MasterBook | None = None
        self._verify: Verifier | None = None
        self.peers: dict[int, PeerState] = {}
        # Set once the spec names every host (at once, or after mDNS discovery: adopt()).
        self._spec_known = asyncio.Event()
        if spec.hosts:
            self._take_spec(spec)
        self.doc: ClusterDoc | None = None
        self.env: Env | None = None
        #: Warnings fixed at start (no token ...) and from the last verification.
        self.static_warnings: list[str] = []
        self.verify_warnings: list[str] = []
        #: Set while a ready worker cannot reach its master (ready stays: see readiness.md).
        self.master_problem: Reason | None = None
        #: Called with each new cluster document (mDNS re-announces the generation).
        self.on_generation: list[Callable[[ClusterDoc], None]] = []
        #: Extra /status sections, e.g. "mdns".
        self.status_sections: dict[str, Callable[[], object]] = {
            "mdns": lambda: {"enabled": False, "error": None}
        }
        self._ready = False
        self._phase: list[Reason] = [Reason("starting", "the sidecar is starting")]
        if not spec.hosts:
            self._phase = [discovering_reason(spec.nnodes, ())]
        self._shutting_down = False
        self._waiters = 0
        self._changed = asyncio.Event()
        self._poked = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._verify_task: asyncio.Task[None] | None = None
        self._peer_client = PeerClient(settings, auth)
        self._started = clock()
        self._deadline = self._started + settings.deadline_s
        self._ready_after_s: float | None = None
        self._last_generation: str | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Rendezvous:
        self._peer_client.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Cancel background work, close the windows and the HTTP client; closing twice is safe."""
        tasks = list(self._tasks)
        if self._verify_task is not None:
            tasks.append(self._verify_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.windows is not None:
            await self.windows.close()
        await self._peer_client.close()

    def begin_shutdown(self) -> None:
        """Turn not ready for good (SIGTERM): /readyz answers 503 from now on."""
        self.not_ready(Reason("shutting_down", "the sidecar is shutting down"))
        self._shutting_down = True  # after: not_ready ignores calls once shutting down
        self._notify()  # wait_ready returns: a long-poll in flight gets the 503 verdict
        if self.book is not None:
            self.book.close()

    def fail(self, reason: Reason) -> None:
        """Turn not ready for a reason found outside the state machine (it crashed)."""
        self.not_ready(reason)

    def adopt(self, spec: ClusterSpec, held: Mapping[str, HeldPort]) -> None:
        """Take the spec mDNS discovery completed (with the ports it needs); run() goes on."""
        if self._spec_known.is_set():
            raise RuntimeError("the spec is already known")
        if not spec.hosts:
            raise ValueError("adopt() needs a spec with hosts")
        self.held.update(held)
        self._take_spec(spec)
        log.info("spec_discovered rank=%d hosts=%s", spec.rank, ",".join(spec.hosts))

    def discovering(self, reason: Reason) -> None:
        """Show why discovery is not complete yet (only while the spec has no hosts)."""
        if not self._spec_known.is_set():
            self.not_ready(reason)

    @property
    def spec_known(self) -> bool:
        """True once the spec names every host and this node's rank."""
        return self._spec_known.is_set()

    def _take_spec(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.accept_loopback = spec.loopback_ok or self.settings.allow_loopback
        if spec.is_master:
            self.book = MasterBook(spec, self.held["master"].port, self.epoch)
        self.peers = {rank: PeerState(rank, host) for rank, host in enumerate(spec.hosts)}
        self._verify = Verifier(
            spec,
            self.settings,
            resolver=self.resolver,
            metrics=self.metrics,
            peers=self.peers,
            user=self.user,
            accept_loopback=self.accept_loopback,
            clock=self._clock,
            deadline=lambda: self._deadline,
            on_peer_failure=self._show_peer_failure,
        )
        if self.settings.probe:
            listener = probe.ProbeListener(
                session=spec.session,
                rank=spec.rank,
                host=spec.host,
                auth=self.auth,
                metrics=self.metrics,
            )
            self.windows = connectivity.Windows(self.held, listener)
            self._prober = connectivity.Prober(
                spec,
                self.settings,
                auth=self.auth,
                metrics=self.metrics,
                route=self._route,
                rng=self._rng,
            )
        self._spec_known.set()

    async def run(self) -> None:
        """Drive this node's side of the rendezvous until cancelled."""
        await self._spec_known.wait()
        if self.windows is not None:
            # Open before anyone can hold our document: the first probes find them open.
            await self.windows.open()
        if self.book is not None:
            await self._run_master(self.book)
        else:
            await self._run_worker()

    # -- readiness ----------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def generation(self) -> str | None:
        return None if self.doc is None else self.doc.generation

    @property
    def ready_after_s(self) -> float | None:
        """Seconds from start to the first ready, None before."""
        return self._ready_after_s

    @property
    def uptime_s(self) -> float:
        return self._clock() - self._started

    def reasons(self) -> list[Reason]:
        """Why the node is not ready (empty when ready)."""
        if self._ready:
            return []
        reasons = list(self._phase)
        if not self._shutting_down and self._clock() > self._deadline:
            reasons.append(
                Reason(
                    "deadline_exceeded",
                    f"not ready within the deadline of {self.settings.deadline_s:g}s; "
                    "the other reasons say what is still missing (still retrying)",
                )
            )
        return reasons

    def warnings(self) -> list[str]:
        env_warnings = list(self.env.warnings) if self.env is not None else []
        return [*self.static_warnings, *self.verify_warnings, *env_warnings]

    @property
    def env_waiters(self) -> int:
        """How many wait_ready calls (GET /env?wait) are waiting right now."""
        return self._waiters

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until ready, shutting down or ``timeout_s`` passed; whether the node is ready."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        self._waiters += 1
        try:
            while not self._ready and not self._shutting_down:
                remaining = end - loop.time()
                if remaining <= 0:
                    return False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), remaining)
        finally:
            self._waiters -= 1
        return self._ready

    def not_ready(self, *reasons: Reason) -> None:
        """Turn (or stay) not ready for ``reasons``; ignored once shutting down."""
        if self._shutting_down:
            return
        self._phase = list(reasons)
        self.env = None
        if self._ready:
            self._ready = False
            self.metrics.ready_transitions.labels("not_ready").inc()
            quiet = any(r.code == "shutting_down" for r in reasons)
            level = logging.INFO if quiet else logging.WARNING
            log.log(level, "not_ready reasons=%s", ",".join(r.code for r in reasons))
        self._notify()

    def _become_ready(self, env: Env) -> None:
        if self._shutting_down:
            return
        self.env = env
        self._phase = []
        if not self._ready:
            self._ready = True
            if self._ready_after_s is None:
                self._ready_after_s = self.uptime_s
            self.metrics.ready_transitions.labels("ready").inc()
            log.info("ready generation=%s", self.generation)
        self._notify()

    def _notify(self) -> None:
        self.metrics.ready.set(1 if self._ready else 0)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # -- master -------------------------------------------------------------------------

    async def _run_master(self, book: MasterBook) -> None:
        own = self._own_member()
        book.record(own)
        self._mark_joined(own, remote=None)
        self.not_ready(self._waiting_reason(book))
        # Workers may be deep in a backoff pause: wake them so nobody waits it out.
        self._poke_workers()
        after: str | None = None
        while not book.closed:
            doc = await book.wait(after, timeout_s=3600.0)
            if doc is not None:
                first = after is None
                after = doc.generation
                self.accept(doc)
                if not first:
                    # A worker outside its long-poll (in a backoff pause after a lost
                    # connection) would miss the new document until its pause ends.
                    self._poke_workers()

    def _poke_workers(self) -> None:
        for host in self.spec.hosts[1:]:
            self._spawn(self._poke(host))

    def _waiting_reason(self, book: MasterBook) -> Reason:
        missing = book.missing()
        names = ", ".join(self.spec.hosts[r] for r in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        return Reason(
            "waiting_for_join",
            f"{len(missing)} of {self.spec.nnodes} nodes have not joined yet: {names}{more}",
            ranks=tuple(missing),
        )

    def handle_join(self, request: wire.JoinRequest, remote: str | None) -> wire.JoinAnswer:
        """Record a worker's join (master only); JoinRejected when refused."""
        book = self._require_master()
        try:
            book.check(request)
        except JoinRejected:
            self.metrics.joins.labels("rejected").inc()
            raise
        self.metrics.joins.labels("accepted").inc()
        before = len(book.members)
        changed = book.record(request.member)
        self._mark_joined(request.member, remote)
        if not changed:
            self._recheck(request.member.host)
        _log_join(request.member, remote, before, len(book.members), self.spec.nnodes)
        if book.doc is None:
            self.not_ready(self._waiting_reason(book))
        return wire.JoinAnswer(
            session=self.spec.session,
            epoch=self.epoch,
            generation=None if book.doc is None else book.doc.generation,
            joined=len(book.members),
            nnodes=self.spec.nnodes,
        )

    async def handle_cluster(self, after: str | None) -> ClusterDoc | None:
        """Long-poll for a document newer than ``after`` (master only); None on timeout."""
        return await self._require_master().wait(after, self.settings.long_poll_s)

    async def handle_report(self, report: wire.Report) -> wire.Verdict:
        """Record a node's checks (master only); the verdict, long-polled while unchanged."""
        book = self._require_master()
        return await local_transport(book, self.settings.long_poll_s)(report)

    def _recheck(self, host: str) -> None:
        """A known worker joined again: retry a verification that gave up or waits on it."""
        task, doc = self._verify_task, self.doc
        if self._ready or doc is None or task is None or self.book is None:
            return
        if doc is not self.book.doc:
            return  # a newer document is on its way through run()
        if task.done() or any(r.host == host for r in self._phase):
            log.info("verification_retry trigger=join host=%s", host)
            self._start_verification(doc)

    def wake(self) -> None:
        """Cut a worker's join backoff short (mDNS saw the master change): re-join now."""
        if self.book is None:
            self._poked.set()

    def handle_poke(self, poke: wire.Poke) -> None:
        """The master (re)started: cut the join backoff short and retry a failed verification."""
        if poke.session != self.spec.session:
            raise JoinRejected(
                409, "session_mismatch", f"poke for session {poke.session!r}, not ours"
            )
        self.metrics.pokes_received.inc()
        self._poked.set()
        task = self._verify_task
        if self.doc is not None and not self._ready and task is not None and task.done():
            self._start_verification(self.doc)

    def _require_master(self) -> MasterBook:
        if not self._spec_known.is_set():
            raise JoinRejected(
                503,
                "discovering",
                f"this node has not finished mDNS discovery (seen {self._phase_detail()}); "
                "retry shortly",
            )
        if self.book is None:
            raise JoinRejected(
                409,
                "not_master",
                f"{self.spec.host} is rank {self.spec.rank}, not the master; "
                f"talk to {self.spec.master}",
            )
        return self.book

    def _phase_detail(self) -> str:
        return next((r.detail or "" for r in self._phase if r.code == "discovering"), "")

    def _mark_joined(self, member: Member, remote: str | None) -> None:
        peer = self.peers[member.rank]
        if not peer.joined or peer.addresses != member.addresses:
            peer.joined_after_s = self.uptime_s
        peer.joined = True
        peer.addresses = member.addresses
        peer.tf_port = member.tf_port
        peer.remote = remote

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _poke(self, host: str) -> None:
        """Best effort: tell a worker's peer API to re-join now."""
        res = await resolve.check(self.resolver, host, None, timeout_s=POKE_TIMEOUT_S)
        if names.dials_self(res, accept_loopback=self.accept_loopback):
            # A worker's name on loopback here would poke ourselves.
            self.metrics.pokes_sent.labels("skipped").inc()
            return
        body = wire.encode_poke(wire.Poke(self.spec.session, self.epoch))
        for address in res.addresses:
            try:
                ok = await self._peer_client.post_poke(
                    self._endpoint(host, address), body, POKE_TIMEOUT_S
                )
            except PeerDown:
                continue
            self.metrics.pokes_sent.labels("accepted" if ok else "refused").inc()
            return
        self.metrics.pokes_sent.labels("unreachable").inc()

    # -- worker -------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        worker = Worker(
            self,
            self.spec,
            self.settings,
            resolver=self.resolver,
            metrics=self.metrics,
            client=self._peer_client,
            endpoint=self._endpoint,
            master_peer=self.peers[0],
            poked=self._poked,
            rng=self._rng,
            accept_loopback=self.accept_loopback,
        )
        await worker.run(self._own_member())

    def lose_generation(self, reason: Reason) -> None:
        """Drop the current document (the master restarted) and restart the deadline."""
        if self._verify_task is not None:
            self._verify_task.cancel()
        self.doc = None
        self._deadline = self._clock() + self.settings.deadline_s
        self.not_ready(reason)

    # -- verification and derivation ------------------------------------------------------

    def accept(self, doc: ClusterDoc) -> None:
        """Act on a new cluster document: not ready until it is verified."""
        if self._last_generation is not None and self._last_generation != doc.generation:
            self.metrics.generation_changes.inc()
            if self._ready:
                self._deadline = self._clock() + self.settings.deadline_s
        self._last_generation = doc.generation
        self.doc = doc
        for member in doc.members:
            peer = self.peers[member.rank]
            peer.joined = True
            peer.addresses = member.addresses
            peer.tf_port = member.tf_port
        log.info("cluster_document generation=%s", doc.generation)
        for callback in self.on_generation:
            try:
                callback(doc)
            except Exception:
                log.exception("generation_callback_failed")
        self._start_verification(doc)

    def _start_verification(self, doc: ClusterDoc) -> None:
        if self._verify_task is not None:
            self._verify_task.cancel()
        self.not_ready(Reason("verifying", f"verifying peer names for generation {doc.generation}"))
        self._verify_task = asyncio.create_task(self._verify_and_derive(doc))

    def _transport(self) -> Callable[[wire.Report], Any]:
        if self.book is not None:
            return local_transport(self.book, self.settings.long_poll_s)
        return http_transport(self._peer_client, lambda: self.master_target)

    async def _verify_and_derive(self, doc: ClusterDoc) -> None:
        """Names, env, connections, then the master's cluster-wide verdict: ready."""
        windows = self.windows
        check = GenerationCheck(
            self,
            self.spec,
            doc,
            self.settings,
            self._transport(),
            net=self._net,
            busy=lambda: frozenset() if windows is None else windows.busy,
            rng=self._rng,
        )
        self.check = check
        if windows is not None:
            await windows.open()  # after a ready generation they were closed
        follow = asyncio.create_task(check.follow())
        probes: asyncio.Task[None] | None = None
        try:
            while True:
                checked = await self._verifier().check(doc)
                self.verify_warnings = [checked.warning] if checked.warning else []
                self._net = check.net = await asyncio.to_thread(_net_facts, checked.route_ifname)
                outcome: Env | Reason = (
                    checked.failures[0]
                    if checked.failures
                    else self._verifier().derive(doc, checked)
                )
                if not isinstance(outcome, Reason):
                    break
                # Tell the master (every node shows it), then judge again after a pause: a
                # fixed /etc/hosts entry or a late DNS record turns the cluster ready
                # without a restart (a poke or a re-join retries at once).
                check.update(checked.failures or [outcome])
                await check.reported(self.settings.resolve_timeout_s)
                await asyncio.sleep(self._rng.uniform(0.5, 1.0) * RECHECK_S)
            if self._prober is not None:
                targets = self._targets(doc)
                check.update(
                    [Reason("verifying", f"trying {len(targets)} connections the job will make")]
                )
                prober = self._prober
                probes = asyncio.create_task(
                    prober.run(targets, lambda failed: check.update(failed, passed=not failed))
                )
            else:
                check.update([], passed=True)
            verdict = await follow
            self.verify_warnings += list(verdict.warnings)
            if windows is not None:
                # Before ready: the job's own listeners must find the held ports free to bind.
                await windows.close()
            self._become_ready(outcome)
        finally:
            await cancel_quietly(probes)
            await cancel_quietly(follow)

    def _targets(self, doc: ClusterDoc) -> list[connectivity.Target]:
        """The connections to try for ``doc``: the master port and the peers in scope."""
        spec = self.spec
        ranks = [rank for rank, peer in self.peers.items() if peer.in_scope]
        addresses = connectivity.verified_addresses(
            doc, ranks, {rank: self.peers[rank].resolution for rank in ranks}
        )
        frameworks = self.settings.frameworks
        return connectivity.plan(
            spec, doc, ranks, addresses, tf="tf" in frameworks, jax="jax" in frameworks
        )

    def _verifier(self) -> Verifier:
        if self._verify is None:
            raise RuntimeError("verification before the spec is known")
        return self._verify

    def _show_peer_failure(self, doc: ClusterDoc, host: str, reason: Reason) -> None:
        """A peer's first check failed: show and report it now, unless the document moved on."""
        check = self.check
        if not self._ready and self.doc is doc and check is not None and check.doc is doc:
            current = [r for r in check.local if r.code != "verifying" and r.host != host]
            check.update([*current, reason])

    def _own_member(self) -> Member:
        tf, jax, probe_port = self.held.get("tf"), self.held.get("jax"), self.held.get("probe")
        return Member(
            rank=self.spec.rank,
            host=self.spec.host,
            addresses=tuple(dict.fromkeys(wire.address(a) for a in self.addresses)),
            tf_port=None if tf is None else tf.port,
            jax_port=None if jax is None else jax.port,
            probe_port=None if probe_port is None or not self.settings.probe else probe_port.port,
        )

    # -- status -------------------------------------------------------------------------

    def _role(self) -> str:
        if not self.spec.hosts:
            return "discovering"
        return "master" if self.spec.is_master else "worker"

    def status(self) -> dict[str, object]:
        """The whole picture for /status."""
        spec = self.spec
        overrides = [] if self.env is None else self.env.overrides
        out: dict[str, object] = {
            "ready": self._ready,
            "reasons": [r.as_json() for r in self.reasons()],
            "generation": self.generation,
            "role": self._role(),
            "spec": {
                "provider": spec.provider,
                "session": spec.session,
                "hosts": list(spec.hosts),
                "rank": spec.rank,
                "nnodes": spec.nnodes,
                "master": spec.master if spec.hosts else None,
                "preferred_port": spec.preferred_port,
                "loopback_ok": spec.loopback_ok,
                "facts": dict(spec.facts),
            },
            "peers": [p.as_json() for p in self.peers.values()],
            "overrides": [
                {"key": o.key, "value": o.value, "derived": o.derived, "source": o.source}
                for o in overrides
            ],
            "user_values": sorted(self.user),
            "warnings": self.warnings(),
            "env_waiters": self.env_waiters,
            "master_problem": None
            if self.master_problem is None
            else self.master_problem.as_json(),
            "ports": {
                name: {
                    "port": held.port,
                    "held": held.held,
                    "skipped": [{"port": s.port, "reason": s.reason} for s in held.skipped],
                }
                for name, held in self.held.items()
            },
            "auth": {"enabled": self.auth.enabled},
            "network": {
                "route_ifname": self._net.ifname,
                "mtu": self._net.mtu,
                "rdma_devices": self._net.rdma,
            },
            "checks": self._checks_status(),
            "timings": {
                "uptime_s": round_s(self.uptime_s),
                "ready_after_s": round_s(self._ready_after_s),
                "deadline_s": self.settings.deadline_s,
            },
        }
        if self.book is not None:
            out["cluster"] = self._cluster_status(self.book)
        for name, section in self.status_sections.items():
            try:
                out[name] = section()
            except Exception as exc:
                out[name] = {"error": str(exc)}
        return out

    def _checks_status(self) -> dict[str, object]:
        out: dict[str, object] = {
            "enabled": self.settings.probe,
            "windows": {} if self.windows is None else dict(self.windows.state),
        }
        if self.check is not None:
            out.update(self.check.status())
        return out

    def _cluster_status(self, book: MasterBook) -> list[dict[str, object]]:
        """The master's view: each node's last report of the current generation (first 256)."""
        nodes: list[dict[str, object]] = []
        for rank, report in sorted(book.reports.items())[:256]:
            nodes.append(
                {
                    "rank": rank,
                    "host": report.host,
                    "passed": report.passed,
                    "failures": len(report.failures),
                    "busy": sorted(report.busy),
                    "route_ifname": report.net.ifname,
                    "mtu": report.net.mtu,
                    "rdma_devices": report.net.rdma,
                }
            )
        return nodes


def _net_facts(ifname: str | None) -> wire.NetFacts:
    """The route interface's MTU and whether RDMA devices are visible (blocking: sysfs)."""
    return wire.NetFacts(
        ifname=ifname,
        mtu=None if ifname is None else netinfo.mtu(ifname),
        rdma=netinfo.rdma_visible(),
    )
