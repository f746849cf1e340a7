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

from rallypoint import resolve, wire
from rallypoint.auth import Authenticator
from rallypoint.masterbook import JoinRejected, MasterBook
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec, Env, Member, OverrideSource
from rallypoint.peerhttp import PeerClient, PeerDown
from rallypoint.ports import HeldPort
from rallypoint.reasons import Reason, auth_reason, discovering_reason
from rallypoint.resolve import Resolver, Verdict
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
        """Cancel background work and close the HTTP client; closing twice is safe."""
        tasks = list(self._tasks)
        if self._verify_task is not None:
            tasks.append(self._verify_task)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
        self._spec_known.set()

    async def run(self) -> None:
        """Drive this node's side of the rendezvous until cancelled."""
        await self._spec_known.wait()
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
        changed = book.record(request.member)
        self._mark_joined(request.member, remote)
        if not changed:
            self._recheck(request.member.host)
        log.info(
            "joined rank=%d host=%s remote=%s", request.member.rank, request.member.host, remote
        )
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
        if res.verdict is Verdict.LOOPBACK and not self.accept_loopback:
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

    async def _verify_and_derive(self, doc: ClusterDoc) -> None:
        checked = await self._verifier().check(doc)
        self.verify_warnings = [checked.warning] if checked.warning else []
        if checked.failures:
            self.not_ready(*checked.failures)
            return
        outcome = self._verifier().derive(doc, checked)
        if isinstance(outcome, Reason):
            self.not_ready(outcome)
            return
        self._become_ready(outcome)

    def _verifier(self) -> Verifier:
        if self._verify is None:
            raise RuntimeError("verification before the spec is known")
        return self._verify

    def _show_peer_failure(self, doc: ClusterDoc, host: str, reason: Reason) -> None:
        """A peer's first check failed: show it now unless ready or the document moved on."""
        if not self._ready and self.doc is doc:
            current = [r for r in self._phase if r.code != "verifying" and r.host != host]
            self.not_ready(*current, reason)

    def _own_member(self) -> Member:
        tf, jax = self.held.get("tf"), self.held.get("jax")
        return Member(
            rank=self.spec.rank,
            host=self.spec.host,
            addresses=tuple(dict.fromkeys(wire.address(a) for a in self.addresses)),
            tf_port=None if tf is None else tf.port,
            jax_port=None if jax is None else jax.port,
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
            "timings": {
                "uptime_s": round_s(self.uptime_s),
                "ready_after_s": round_s(self._ready_after_s),
                "deadline_s": self.settings.deadline_s,
            },
        }
        for name, section in self.status_sections.items():
            try:
                out[name] = section()
            except Exception as exc:
                out[name] = {"error": str(exc)}
        return out
