"""The rendezvous state machines: the master's join book, the worker's join loop, verification.

A star on the master (node rank 0). Workers resolve the master's name and POST /v1/join until
accepted, then long-poll GET /v1/cluster. Once every node joined, the master issues a cluster
document; every node verifies the peer names it needs, derives its env and turns ready. A new
generation (the master restarted, or a node re-joined with different facts) turns the node
not ready until the new document is verified. Readiness is always explained by Reasons with
stable codes (docs/readiness.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from rallypoint import derive, netinfo, resolve, wire
from rallypoint.auth import Authenticator
from rallypoint.errors import AuthError, OverrideError, PeerMessageError, TFConfigError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec, DeriveOptions, Env, Member, OverrideSource
from rallypoint.ports import HeldPort
from rallypoint.resolve import Resolution, Resolver, Verdict
from rallypoint.settings import Settings

log = logging.getLogger(__name__)

#: (host name, verified address) -> (address to connect to, peer API port).
PeerEndpoint = Callable[[str, str], tuple[str, int]]

#: Pokes are best effort: a worker that does not answer this fast is not waited for.
POKE_TIMEOUT_S = 2.0

_RESOLVE_FAILED = frozenset({Verdict.NOT_FOUND, Verdict.TIMED_OUT})


@dataclass(frozen=True, slots=True)
class Reason:
    """Why a node is not ready: a stable machine-readable code and a one-line remedy."""

    code: str
    message: str
    host: str | None = None
    detail: str | None = None
    ranks: tuple[int, ...] = ()

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.host is not None:
            out["host"] = self.host
        if self.detail is not None:
            out["detail"] = self.detail
        if self.ranks:
            out["ranks"] = list(self.ranks)
        return out


@dataclass(slots=True)
class PeerState:
    """What this node knows about one node of the session, for /status."""

    rank: int
    host: str
    joined: bool = False
    joined_after_s: float | None = None
    addresses: tuple[str, ...] = ()
    tf_port: int | None = None
    remote: str | None = None
    in_scope: bool = False
    resolution: Resolution | None = None

    def as_json(self) -> dict[str, object]:
        res = self.resolution
        return {
            "rank": self.rank,
            "host": self.host,
            "joined": self.joined,
            "joined_after_s": _round(self.joined_after_s),
            "addresses": list(self.addresses),
            "tf_port": self.tf_port,
            "remote": self.remote,
            "verified": self.in_scope,
            "verdict": None if res is None else str(res.verdict),
            "resolved": [] if res is None else list(res.addresses),
            "detail": None if res is None else res.detail,
            "attempts": 0 if res is None else res.attempts,
            "resolve_s": None if res is None else _round(res.elapsed_s),
        }


class JoinRejected(PeerMessageError):
    """Raised when a peer request is well-formed but refused (wrong session, impostor ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class _PeerDown(Exception):
    """The peer could not be reached (refused, reset, timed out)."""


class _Rejoin(Exception):
    """The long-poll ended in a way that calls for a new join (poke, lost connection)."""


class Backoff:
    """Capped full-jitter exponential backoff whose pause a poke cuts short."""

    def __init__(
        self, initial_s: float, max_s: float, wake: asyncio.Event, rng: random.Random
    ) -> None:
        self._initial_s = initial_s
        self._max_s = max_s
        self._wake = wake
        self._rng = rng
        self._attempt = 0

    def reset(self) -> None:
        self._attempt = 0

    async def sleep(self) -> bool:
        """Pause up to the current ceiling; True when a poke ended the pause early."""
        ceiling = min(self._max_s, self._initial_s * 2 ** min(self._attempt, 32))
        self._attempt += 1
        if not self._wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._rng.uniform(0.0, ceiling))
        woke = self._wake.is_set()
        self._wake.clear()
        if woke:
            self.reset()
        return woke


class MasterBook:
    """The master's record of joined nodes and the cluster document derived from it."""

    def __init__(self, spec: ClusterSpec, master_port: int, epoch: str) -> None:
        self.spec = spec
        self.master_port = master_port
        self.epoch = epoch
        self.members: dict[int, Member] = {}
        self.doc: ClusterDoc | None = None
        self._counter = 0
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every long-poll now (they answer "nothing new"): the master is going away."""
        self._closed = True
        self._changed.set()

    def missing(self) -> list[int]:
        return [r for r in range(self.spec.nnodes) if r not in self.members]

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
        if self.missing():
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
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def wait(self, after: str | None, timeout_s: float) -> ClusterDoc | None:
        """A document whose generation is not ``after``, or None after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self.doc is None or self.doc.generation == after:
            remaining = end - loop.time()
            if remaining <= 0 or self._closed:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None
        return self.doc


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
        self._changed = asyncio.Event()
        self._poked = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._verify_task: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._started = clock()
        self._deadline = self._started + settings.deadline_s
        self._ready_after_s: float | None = None
        self._last_generation: str | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def __aenter__(self) -> Rendezvous:
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.settings.resolve_timeout_s)
        )
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
        if self._http is not None:
            await self._http.close()
            self._http = None

    def begin_shutdown(self) -> None:
        """Turn not ready for good (SIGTERM): /readyz answers 503 from now on."""
        self._not_ready(Reason("shutting_down", "the sidecar is shutting down"))
        self._shutting_down = True  # after: _not_ready ignores calls once shutting down
        if self.book is not None:
            self.book.close()

    def fail(self, reason: Reason) -> None:
        """Turn not ready for a reason found outside the state machine (it crashed)."""
        self._not_ready(reason)

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
            self._not_ready(reason)

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

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait until ready or ``timeout_s`` passed; whether the node is ready."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while not self._ready:
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    def _not_ready(self, *reasons: Reason) -> None:
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
        self._not_ready(self._waiting_reason(book))
        # Workers may be deep in a backoff pause: wake them so nobody waits it out.
        self._poke_workers()
        after: str | None = None
        while not book.closed:
            doc = await book.wait(after, timeout_s=3600.0)
            if doc is not None:
                first = after is None
                after = doc.generation
                self._accept(doc)
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
            self._not_ready(self._waiting_reason(book))
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
            headers = {"Content-Type": "application/json"}
            headers.update(self.auth.sign("POST /v1/poke", body))
            url = _url(self._endpoint(host, address), "/v1/poke")
            try:
                async with self._client().post(
                    url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(POKE_TIMEOUT_S)
                ) as resp:
                    await resp.read()
                    ok = resp.status < 300
            except (aiohttp.ClientError, OSError, TimeoutError):
                continue
            self.metrics.pokes_sent.labels("accepted" if ok else "refused").inc()
            return
        self.metrics.pokes_sent.labels("unreachable").inc()

    # -- worker -------------------------------------------------------------------------

    async def _run_worker(self) -> None:
        own = self._own_member()
        master = self.spec.master
        self._not_ready(Reason("waiting_for_master", f"joining the master {master}", host=master))
        backoff = Backoff(
            self.settings.backoff_initial_s, self.settings.backoff_max_s, self._poked, self._rng
        )
        epoch: str | None = None
        after: str | None = None
        while True:
            target, answer = await self._join(own, after, backoff)
            backoff.reset()
            if epoch is not None and answer.epoch != epoch:
                log.warning("master_restarted old_epoch=%s new_epoch=%s", epoch, answer.epoch)
                self._lose_generation(
                    Reason(
                        "generation_changed",
                        f"the master {master} restarted; waiting for its new cluster document",
                        host=master,
                    )
                )
            epoch = answer.epoch
            if self.doc is None:
                self._not_ready(
                    Reason(
                        "waiting_for_cluster",
                        f"joined {master} as rank {self.spec.rank}; {answer.joined} of "
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
                    self._not_ready(problem)
                    after = doc.generation
                    continue
                if doc.members[self.spec.rank] != own:
                    break  # the master holds stale facts about us (we restarted): re-join
                after = doc.generation
                self._accept(doc)

    async def _join(
        self, own: Member, after: str | None, backoff: Backoff
    ) -> tuple[tuple[str, int], wire.JoinAnswer]:
        master = self.spec.master
        body = wire.encode_join(wire.JoinRequest(self.spec.session, own, after))
        while True:
            res = await resolve.check(
                self.resolver, master, None, timeout_s=self.settings.resolve_timeout_s
            )
            self.metrics.resolutions.labels(str(res.verdict)).inc()
            self.peers[0].resolution = res
            problem: Reason
            if res.verdict in _RESOLVE_FAILED:
                problem = Reason(
                    "resolve_failed",
                    f"the master's name {master} does not resolve here; wait for DNS or fix it",
                    host=master,
                    detail=res.detail,
                )
            elif res.verdict is Verdict.LOOPBACK and not self.accept_loopback:
                problem = _loopback_reason(master, res)
            else:
                problem = Reason("master_unreachable", f"no address of {master}", host=master)
                for address in res.addresses:
                    target = self._endpoint(master, address)
                    try:
                        answer = await self._post_join(target, body)
                    except _PeerDown as exc:
                        problem = Reason(
                            "master_unreachable",
                            f"cannot reach the master {master}'s peer API at {address}: "
                            "is its sidecar running and the peer port open?",
                            host=master,
                            detail=str(exc),
                        )
                        continue
                    except JoinRejected as exc:
                        problem = Reason("join_rejected", str(exc), host=master, detail=exc.code)
                        break
                    except AuthError as exc:
                        self.metrics.auth_failures.labels(auth_reason(exc)).inc()
                        problem = Reason("auth_failed", str(exc), host=master)
                        break
                    except PeerMessageError as exc:
                        problem = Reason(
                            "master_answer_invalid", f"the master's join answer: {exc}", host=master
                        )
                        break
                    self.metrics.join_attempts.labels("accepted").inc()
                    self.master_problem = None
                    return target, answer
            self.metrics.join_attempts.labels(problem.code).inc()
            if self._ready:
                self.master_problem = problem
            else:
                self._not_ready(problem)
            await backoff.sleep()

    async def _post_join(self, target: tuple[str, int], body: bytes) -> wire.JoinAnswer:
        headers = {"Content-Type": "application/json"}
        headers.update(self.auth.sign("POST /v1/join", body))
        timeout = aiohttp.ClientTimeout(total=self.settings.resolve_timeout_s)
        try:
            async with self._client().post(
                _url(target, "/v1/join"), data=body, headers=headers, timeout=timeout
            ) as resp:
                payload = await _read_limited(resp, wire.MAX_JOIN_BYTES)
                status, answer_headers = resp.status, resp.headers
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _PeerDown(_describe(exc)) from exc
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify("200 /v1/join", payload, answer_headers)
        answer = wire.parse_join_answer(payload)
        if answer.session != self.spec.session:
            raise JoinRejected(
                409, "session_mismatch", f"the master answered for {answer.session!r}"
            )
        return answer

    async def _poll(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        """One long-poll; the document, None on timeout, _Rejoin on a poke or lost master."""
        poll = asyncio.ensure_future(self._get_cluster(target, after))
        poked = asyncio.ensure_future(self._poked.wait())
        try:
            await asyncio.wait({poll, poked}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (poll, poked):
                task.cancel()
            await asyncio.gather(poll, poked, return_exceptions=True)
        if not poll.done() or poll.cancelled():
            self._poked.clear()
            raise _Rejoin("poked")
        try:
            return poll.result()
        except (_PeerDown, JoinRejected) as exc:
            log.info("master_lost master=%s error=%s", self.spec.master, exc)
            raise _Rejoin(str(exc)) from exc
        except AuthError as exc:
            self.metrics.auth_failures.labels(auth_reason(exc)).inc()
            self._not_ready(Reason("auth_failed", str(exc), host=self.spec.master))
            raise _Rejoin(str(exc)) from exc
        except PeerMessageError as exc:
            self._not_ready(
                Reason("master_answer_invalid", f"cluster document: {exc}", host=self.spec.master)
            )
            raise _Rejoin(str(exc)) from exc

    async def _get_cluster(self, target: tuple[str, int], after: str | None) -> ClusterDoc | None:
        query = "" if after is None else after
        headers = self.auth.sign(f"GET /v1/cluster?after={query}", b"")
        params = {} if after is None else {"after": after}
        timeout = aiohttp.ClientTimeout(
            total=self.settings.long_poll_s + self.settings.resolve_timeout_s
        )
        try:
            async with self._client().get(
                _url(target, "/v1/cluster"), params=params, headers=headers, timeout=timeout
            ) as resp:
                payload = await _read_limited(resp, wire.MAX_DOC_BYTES)
                status, answer_headers = resp.status, resp.headers
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _PeerDown(_describe(exc)) from exc
        if status == 204:
            return None
        if status != 200:
            raise _refusal(status, payload)
        self.auth.verify("200 /v1/cluster", payload, answer_headers)
        return wire.parse_cluster_doc(payload)

    def _foreign(self, doc: ClusterDoc) -> Reason | None:
        """Why a document does not describe our session's spec, or None."""
        hosts = tuple(m.host.lower() for m in doc.members)
        if doc.session != self.spec.session or hosts != tuple(h.lower() for h in self.spec.hosts):
            return Reason(
                "spec_mismatch",
                f"the master's cluster document lists {len(hosts)} hosts for session "
                f"{doc.session!r}, which differs from this node's spec; give every node the "
                "same node list",
                host=self.spec.master,
            )
        return None

    def _lose_generation(self, reason: Reason) -> None:
        if self._verify_task is not None:
            self._verify_task.cancel()
        self.doc = None
        self._deadline = self._clock() + self.settings.deadline_s
        self._not_ready(reason)

    # -- verification and derivation ------------------------------------------------------

    def _accept(self, doc: ClusterDoc) -> None:
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
        self._not_ready(
            Reason("verifying", f"verifying peer names for generation {doc.generation}")
        )
        self._verify_task = asyncio.create_task(self._verify_and_derive(doc))

    async def _verify_and_derive(self, doc: ClusterDoc) -> None:
        spec = self.spec
        ranks = resolve.scope_ranks(
            spec.nnodes, spec.rank, self.settings.resolve_scope, seed=doc.session
        )
        peers = [r for r in ranks if r != spec.rank]
        for peer in self.peers.values():
            peer.in_scope = peer.rank in ranks
        own = await self._check_own(doc.members[spec.rank])
        results = await asyncio.gather(*(self._verify_peer(doc, doc.members[r]) for r in peers))
        failures = [r for r in (self._peer_reason(res) for res in results) if r is not None]
        self_reason, self_warning = self._judge_own(own)
        self.verify_warnings = [self_warning] if self_warning else []
        if self_reason is not None:
            failures.insert(0, self_reason)
        if failures:
            self._not_ready(*failures)
            return
        master_ip = self._master_address(doc, own)
        options = DeriveOptions(
            nproc_per_node=self.settings.nproc_per_node,
            frameworks=self.settings.frameworks,
            tf_layout=self.settings.tf_layout,
            master_ip=master_ip if self.settings.master_addr_mode == "ip" else None,
            ifname=(
                await asyncio.to_thread(netinfo.route_ifname, master_ip)
                if self.settings.emit_ifname and master_ip is not None
                else None
            ),
            user=self.user,
        )
        if self.settings.master_addr_mode == "ip" and master_ip is None:
            self._not_ready(
                Reason(
                    "resolve_failed",
                    "--master-addr ip: no verified address for the master",
                    host=spec.master,
                )
            )
            return
        try:
            env = derive.derive(spec, doc, options)
        except OverrideError as exc:
            self._not_ready(Reason("override_invalid", str(exc)))
            return
        except TFConfigError as exc:
            self._not_ready(Reason("tfconfig_invalid", str(exc)))
            return
        self._become_ready(env)

    async def _check_own(self, member: Member) -> Resolution:
        res = await resolve.check(
            self.resolver,
            self.spec.host,
            member.addresses or None,
            timeout_s=self.settings.resolve_timeout_s,
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        self.peers[self.spec.rank].resolution = res
        return res

    def _judge_own(self, res: Resolution) -> tuple[Reason | None, str | None]:
        """Own name on loopback (Debian's 127.0.1.1): a warning, fatal with --strict-self."""
        if res.verdict is Verdict.OK or (res.verdict is Verdict.LOOPBACK and self.accept_loopback):
            return None, None
        host = self.spec.host
        if res.verdict is Verdict.LOOPBACK:
            text = (
                f"this node's own name {host} resolves to loopback "
                f"({', '.join(res.addresses)}); fix /etc/hosts or use --emit-ifname"
            )
        else:
            text = f"this node's own name {host} does not check out: {res.detail}"
        if self.settings.strict_self:
            return Reason(
                "strict_self",
                f"{text} (fatal with --strict-self)",
                host=host,
                detail=str(res.verdict),
            ), None
        log.warning("own_name verdict=%s host=%s", res.verdict, host)
        return None, text

    async def _verify_peer(self, doc: ClusterDoc, member: Member) -> Resolution:
        peer = self.peers[member.rank]
        expected = member.addresses or None
        res = await resolve.check(
            self.resolver, member.host, expected, timeout_s=self.settings.resolve_timeout_s
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        peer.resolution = res
        if self._peer_reason(res) is None:
            return res
        # Show the first failure at once; the retries below may take until the deadline.
        if not self._ready and self.doc is doc:
            current = [r for r in self._phase if r.code != "verifying" and r.host != member.host]
            reason = self._peer_reason(res)
            assert reason is not None
            self._not_ready(*current, reason)
        res = await resolve.verify(
            self.resolver,
            member.host,
            expected,
            deadline=self._deadline,
            timeout_s=self.settings.resolve_timeout_s,
            backoff_initial_s=self.settings.backoff_initial_s,
            backoff_max_s=self.settings.backoff_max_s,
            clock=self._clock,
            accept_loopback=self.accept_loopback,
        )
        self.metrics.resolutions.labels(str(res.verdict)).inc()
        peer.resolution = res
        return res

    def _peer_reason(self, res: Resolution) -> Reason | None:
        if res.verdict is Verdict.OK:
            return None
        if res.verdict is Verdict.LOOPBACK:
            return None if self.accept_loopback else _loopback_reason(res.host, res)
        if res.verdict is Verdict.MISMATCH:
            return Reason(
                "address_mismatch",
                f"peer {res.host} resolves here to an address it did not report; "
                "fix its DNS or /etc/hosts entry",
                host=res.host,
                detail=res.detail,
            )
        return Reason(
            "resolve_failed",
            f"peer {res.host} does not resolve here ({res.verdict}); wait for DNS or fix it",
            host=res.host,
            detail=res.detail,
        )

    def _master_address(self, doc: ClusterDoc, own: Resolution) -> str | None:
        """The master's verified address: resolved here and reported by the master."""
        master = doc.members[0]
        res = own if self.spec.is_master else self.peers[0].resolution
        resolved = list(res.addresses) if res is not None else []
        for address in resolved:
            if address in master.addresses:
                return address
        if master.addresses:
            return master.addresses[0]
        return resolved[0] if resolved else None

    def _own_member(self) -> Member:
        tf = self.held.get("tf")
        return Member(
            rank=self.spec.rank,
            host=self.spec.host,
            addresses=tuple(dict.fromkeys(wire.address(a) for a in self.addresses)),
            tf_port=None if tf is None else tf.port,
        )

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("Rendezvous used outside its async context")
        return self._http

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
                "uptime_s": _round(self.uptime_s),
                "ready_after_s": _round(self._ready_after_s),
                "deadline_s": self.settings.deadline_s,
            },
        }
        for name, section in self.status_sections.items():
            try:
                out[name] = section()
            except Exception as exc:
                out[name] = {"error": str(exc)}
        return out


def auth_reason(exc: AuthError) -> str:
    """A stable metric label for an authentication failure: the reason auth.py gave it."""
    return exc.reason


def discovering_reason(nnodes: int, seen: Sequence[str]) -> Reason:
    """Not ready because mDNS discovery has seen fewer than ``nnodes`` hosts of the session."""
    names = ", ".join(seen[:8]) + (f" and {len(seen) - 8} more" if len(seen) > 8 else "")
    return Reason(
        "discovering",
        f"mDNS discovery has seen {len(seen)} of {nnodes} nodes of the session"
        + (f" ({names})" if names else "")
        + "; start the others, or check that multicast reaches every node",
        detail=f"{len(seen)}/{nnodes}",
    )


def _loopback_reason(host: str, res: Resolution) -> Reason:
    return Reason(
        "loopback_peer",
        f"peer {host} resolves to loopback ({', '.join(res.addresses)}) on this node, which "
        "would connect to itself; map the name to the peer's cluster address in /etc/hosts "
        "or DNS",
        host=host,
        detail=res.detail,
    )


def _refusal(status: int, payload: bytes) -> Exception:
    message = payload[:300].decode("utf-8", "replace")
    code = f"http_{status}"
    with contextlib.suppress(ValueError):
        data = json.loads(payload)
        if isinstance(data, dict):
            message = str(data.get("error", message))
            code = str(data.get("code", code))
    if status == 401:
        return AuthError(f"the peer refused our signature: {message}", reason="refused")
    return JoinRejected(status, code, f"refused with HTTP {status}: {message}")


async def _read_limited(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    payload = bytearray()
    async for chunk in resp.content.iter_any():
        payload += chunk
        if len(payload) > limit:
            raise PeerMessageError(f"answer larger than {limit} bytes")
    return bytes(payload)


def _url(target: tuple[str, int], path: str) -> str:
    host, port = target
    if ":" in host:
        host = f"[{host.replace('%', '%25')}]"
    return f"http://{host}:{port}{path}"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
