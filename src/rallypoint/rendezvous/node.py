"""One node's side of the rendezvous: composes its readiness, master or worker role and checks.

A star on the master (node rank 0). Workers resolve the master's name and POST /v1/join until
accepted, then long-poll GET /v1/cluster. Once every node joined, the master issues a cluster
document; every node verifies the peer names it needs, derives its env and turns ready. A new
generation (the master restarted, or a node re-joined with different facts) turns the node
not ready until the new document is verified. Readiness is always explained by Reasons with
stable codes (docs/readiness.md).

The parts: readiness.py (ready or why not), peers.py (what is known of each node),
master.py beside masterbook.py (the master's role), worker.py (the worker's join loop),
verification.py with namecheck.py and clustercheck.py (each document up to ready), status.py.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections.abc import Callable, Mapping, Sequence

from rallypoint.auth import Authenticator
from rallypoint.core import fanout, liveness
from rallypoint.core.clock import ClockEstimate
from rallypoint.core.lifecycle import AsyncResource
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec, Member, OverrideSource
from rallypoint.net import probe
from rallypoint.net.peerhttp import PeerClient, PeerEndpoint
from rallypoint.net.ports import HeldPort
from rallypoint.net.resolve import Resolver
from rallypoint.reasons import Reason, discovering_reason
from rallypoint.rendezvous import status
from rallypoint.rendezvous.afterready import room
from rallypoint.rendezvous.afterready.jobwatch import JobWatch
from rallypoint.rendezvous.afterready.keepalive import Keepalive
from rallypoint.rendezvous.afterready.progresswatch import ProgressWatch
from rallypoint.rendezvous.checks.clustercheck import http_transport
from rallypoint.rendezvous.checks.prober import Prober
from rallypoint.rendezvous.checks.probewindows import Windows
from rallypoint.rendezvous.checks.verification import Verification
from rallypoint.rendezvous.cluster.master import Master, poke_host
from rallypoint.rendezvous.cluster.masterbook import MasterBook, Transport, local_transport
from rallypoint.rendezvous.cluster.relay import Relay
from rallypoint.rendezvous.cluster.worker import run_worker
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.peerapi import PeerApi
from rallypoint.rendezvous.peers import PeerTable
from rallypoint.rendezvous.readiness import Readiness
from rallypoint.rendezvous.tasks import cancel_quietly
from rallypoint.settings import Settings
from rallypoint.wire import fields
from rallypoint.wire.jobstates import JOBS_UNKNOWN, JobsUnknown, JobView

log = logging.getLogger(__name__)

#: Longest wait for the goodbye's answers when the sidecar stops.
GOODBYE_S = 2.0


class Rendezvous(AsyncResource):
    """One node's side of the rendezvous, its readiness and everything /status shows."""

    # Built by _take_spec once the spec names every host (None until then, or for good).
    book: MasterBook | None = None
    master: Master | None = None
    #: This node's group service when it relays for a group of ranks (core/fanout.py).
    relay: Relay | None = None
    verification: Verification | None = None
    #: After ready, the keep-alives that name a peer gone (None: --keepalive 0).
    keepalive: Keepalive | None = None
    #: Each node's job progress (None until the node list is known).
    progress: ProgressWatch | None = None
    #: The supervised job on every node (`rallypoint run`).
    jobs: JobWatch | None = None
    #: What the master, worker and verification share.
    ctx: NodeContext | None = None
    windows: Windows | None = None
    #: Where the last accepted join reached the master's peer API (reports go there).
    master_target: tuple[str, int] | None = None

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
        offsets: ClockEstimate | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.auth = auth
        self.metrics = metrics
        self.addresses = tuple(addresses)
        self.held = dict(held)
        self.user = dict(user)
        self._endpoint = endpoint or (lambda _host, address: (address, settings.peer_port))
        self._route = route or probe.direct
        self._clock = clock
        self._rng = rng or random.Random()
        self._set_spec(spec)
        # Unique across master restarts: every generation this master issues starts with it.
        self.epoch = secrets.token_hex(6)
        starting = Reason("starting", "the sidecar is starting")
        phase = starting if spec.hosts else discovering_reason(spec.nnodes, ())
        self.readiness = Readiness(
            metrics, deadline_s=settings.deadline_s, clock=clock, phase=phase
        )
        #: Called with each new cluster document (mDNS re-announces the generation).
        self.on_generation: list[Callable[[ClusterDoc], None]] = []
        self.poked = asyncio.Event()
        #: This node's clock offset to the master (core/clock.py); the Authenticator's clock.
        self.offsets = offsets or ClockEstimate(time.time, on_change=metrics.clock_offset.set)
        #: Extra /status sections, e.g. "mdns".
        self.status_sections = self._status_sections()
        self.peer_client = PeerClient(
            auth,
            self.offsets,
            exchange_s=settings.resolve_timeout_s,
            long_poll_s=settings.long_poll_s,
        )
        #: What this node answers on its peer API (server/peer.py dispatches to it).
        self.peer_api = PeerApi(self)
        # Set once the spec names every host (at once, or after mDNS discovery: adopt()).
        self._spec_known = asyncio.Event()
        if spec.hosts:
            self._take_spec(spec)

    def _set_spec(self, spec: ClusterSpec) -> None:
        """Take ``spec`` and what follows from it alone: the loopback rule, the peer table."""
        self.spec = spec
        self.accept_loopback = spec.loopback_ok or self.settings.allow_loopback
        self.peers = PeerTable(spec)

    def _status_sections(self) -> dict[str, Callable[[], object]]:
        """The /status sections beside the core document (the sidecar replaces "mdns")."""
        return {
            "mdns": lambda: {"enabled": False, "error": None},
            "liveness": self._liveness_status,
            "job": self.job_status,
            "clock": self.offsets.status,
        }

    def _liveness_status(self) -> dict[str, object]:
        keepalive = self.keepalive
        if keepalive is None:
            return liveness.status(None)
        return liveness.status(keepalive.watch, keepalive.named(), self.offsets.wall)

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the HTTP client the roles share."""
        self.peer_client.open()

    async def close(self) -> None:
        """Cancel background work, close the windows and the HTTP client; closing twice is safe."""
        if self.master is not None:
            await self.master.close()
        if self.relay is not None:
            await self.relay.close()
        if self.verification is not None:
            await self.verification.close()
        if self.windows is not None:
            await self.windows.close()
        await self.peer_client.close()

    async def goodbye(self) -> None:
        """This sidecar stops on purpose: the nodes it keeps alive with hear it leave
        (keepalive.goodbye), within GOODBYE_S at most."""
        if self.keepalive is None or not self.keepalive.watch.started:
            return
        try:
            await self.keepalive.goodbye(min(self.settings.keepalive_s, GOODBYE_S))
        except Exception as exc:  # a goodbye that fails must not keep the sidecar from stopping
            log.warning("goodbye_failed", extra={"error": repr(exc)})

    def begin_shutdown(self) -> None:
        """Turn not ready for good (SIGTERM): /readyz answers 503 from now on."""
        self.readiness.begin_shutdown()
        if self.book is not None:
            self.book.close()

    def fail(self, reason: Reason) -> None:
        """Turn not ready for a reason found outside the state machine (it crashed)."""
        self.readiness.not_ready(reason)

    def adopt(self, spec: ClusterSpec, held: Mapping[str, HeldPort]) -> None:
        """Take the spec mDNS discovery completed (with the ports it needs); run() goes on."""
        if self._spec_known.is_set():
            raise RuntimeError("the spec is already known")
        if not spec.hosts:
            raise ValueError("adopt() needs a spec with hosts")
        self.held.update(held)
        self._take_spec(spec)
        log.info("spec_discovered", extra={"rank": spec.rank, "hosts": ",".join(spec.hosts)})

    def discovering(self, reason: Reason) -> None:
        """Show why discovery is not complete yet (only while the spec has no hosts)."""
        if not self._spec_known.is_set():
            self.readiness.not_ready(reason)

    @property
    def spec_known(self) -> bool:
        """True once the spec names every host and this node's rank."""
        return self._spec_known.is_set()

    def _take_spec(self, spec: ClusterSpec) -> None:
        """Build the parts that need every host and this node's rank; run() goes on."""
        self._set_spec(spec)
        self.metrics.session_info.labels(spec.session, spec.rank).set(1)
        self.offsets.reference = spec.is_master  # the master's clock is the one measured against
        self.windows, prober = self._connection_check(spec)
        if spec.is_master:
            self.book = MasterBook(spec, self.held["master"].port, self.epoch)
            self.readiness.warn_from(self.book.verdict.warnings)
        transport = self._transport()
        self.ctx = self._node_context(spec)
        self.verification = Verification(
            self.ctx,
            user=self.user,
            transport=transport,
            book=self.book,
            windows=self.windows,
            prober=prober,
            on_generation=self.on_generation,
        )
        if self.book is not None:
            self.master = Master(self.book, self.ctx, documents=self.verification)
        after = room.build(self.ctx, self.offsets, boot=self.epoch)
        self.jobs, self.progress, self.keepalive = after.jobs, after.progress, after.keepalive
        size = fanout.group_size(spec.nnodes, self.settings.relay_group_size)
        if fanout.group(spec.rank, size, spec.nnodes):
            ctx = self.ctx
            self.relay = Relay(ctx, poke=lambda host, epoch: poke_host(ctx, host, epoch))
            self.status_sections["relay"] = self.relay.status
        self._spec_known.set()

    def _connection_check(self, spec: ClusterSpec) -> tuple[Windows | None, Prober | None]:
        """The probe windows and the prober, or neither when connections are not checked."""
        if not self.settings.probe:
            return None, None
        listener = probe.ProbeListener(
            session=spec.session,
            rank=spec.rank,
            host=spec.host,
            auth=self.auth,
            metrics=self.metrics,
        )
        prober = Prober(
            spec,
            self.settings,
            auth=self.auth,
            metrics=self.metrics,
            route=self._route,
            rng=self._rng,
        )
        return Windows(self.held, listener), prober

    def _transport(self) -> Transport:
        """Where this node's reports go: the master's own book, or the master's peer API."""
        if self.book is not None:
            return local_transport(self.book, self.settings.long_poll_s)
        return http_transport(self.peer_client, lambda: self.master_target, self.offsets.facts)

    def _node_context(self, spec: ClusterSpec) -> NodeContext:
        """What the master, worker and verification share, for ``spec``."""
        return NodeContext(
            spec=spec,
            settings=self.settings,
            resolver=self.resolver,
            metrics=self.metrics,
            readiness=self.readiness,
            peers=self.peers,
            client=self.peer_client,
            endpoint=self._endpoint,
            accept_loopback=self.accept_loopback,
            clock=self._clock,
            rng=self._rng,
        )

    async def run(self) -> None:
        """Drive this node's side of the rendezvous until cancelled."""
        await self._spec_known.wait()
        if self.windows is not None:
            # Open before anyone can hold our document: the first probes find them open.
            await self.windows.open()
        keeping = None if self.keepalive is None else asyncio.create_task(self.keepalive.run())
        if keeping is not None:
            keeping.add_done_callback(self._keepalive_ended)
        jobs, changed = self.jobs, self.readiness.changed
        following = None if jobs is None else asyncio.create_task(jobs.follow(changed))
        try:
            if self.master is not None:
                await self.master.run(self._own_member())
            else:
                ctx, own = self._context(), self._own_member()
                await run_worker(
                    self,
                    ctx,
                    own,
                    documents=self._verification(),
                    poked=self.poked,
                    relay=self.relay,
                )
        finally:
            await cancel_quietly(keeping)
            await cancel_quietly(following)

    def _keepalive_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("keepalive_crashed", extra={"error": repr(exc)}, exc_info=exc)
        self.fail(Reason("internal_error", f"the keep-alive stopped: {exc!r}; see the log"))

    def _own_member(self) -> Member:
        tf, jax, probe_port = self.held.get("tf"), self.held.get("jax"), self.held.get("probe")
        return Member(
            rank=self.spec.rank,
            host=self.spec.host,
            addresses=tuple(dict.fromkeys(fields.address(a) for a in self.addresses)),
            tf_port=None if tf is None else tf.port,
            jax_port=None if jax is None else jax.port,
            probe_port=None if probe_port is None or not self.settings.probe else probe_port.port,
        )

    def accept(self, doc: ClusterDoc) -> None:
        """Act on the master's new cluster document: not ready until it is verified."""
        self._verification().accept(doc)
        if self.relay is not None:
            self.relay.publish(doc)

    def status(self) -> dict[str, object]:
        """The whole picture for /status."""
        return status.document(
            spec=self.spec,
            settings=self.settings,
            readiness=self.readiness,
            peers=self.peers,
            user=self.user,
            held=self.held,
            auth_enabled=self.auth.enabled,
            verification=self.verification,
            book=self.book,
            sections=self.status_sections,
        )

    def job_status(self) -> JobView | JobsUnknown:
        """GET /job's answer and /status "job" (the short form before the node list is known)."""
        return JOBS_UNKNOWN if self.jobs is None else self.jobs.view()

    def wake(self) -> None:
        """Cut a worker's join backoff short (mDNS saw the master change): re-join now."""
        if self.book is None:
            self.poked.set()

    def _context(self) -> NodeContext:
        if self.ctx is None:
            raise RuntimeError("the node's parts before the spec is known")
        return self.ctx

    def _verification(self) -> Verification:
        if self.verification is None:
            raise RuntimeError("verification before the spec is known")
        return self.verification
