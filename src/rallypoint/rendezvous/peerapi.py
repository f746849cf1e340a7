"""The peer API's requests on one node: who serves what, and the answers (server/peer.py
dispatches each route of wire/routes.py to the method its row names).

A worker asked what only the master serves says so (409 ``not_master``); a node still in
mDNS discovery answers 503 ``discovering``; a relay serves its group's joins, documents and
reports (docs/scale.md).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, overload

from rallypoint import wire
from rallypoint.auth import Authenticator
from rallypoint.core.clock import ClockEstimate, sender_host
from rallypoint.errors import AuthError, JoinRejected, MeshUnavailable, PeerDown, PeerMessageError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterDoc, ClusterSpec
from rallypoint.net.peerhttp import PeerClient
from rallypoint.rendezvous import status
from rallypoint.rendezvous.afterready.keepalive import Keepalive
from rallypoint.rendezvous.checks.verification import Verification
from rallypoint.rendezvous.cluster.master import Master
from rallypoint.rendezvous.cluster.masterbook import EncodedDoc, MasterBook
from rallypoint.rendezvous.cluster.relay import Relay
from rallypoint.rendezvous.peers import PeerTable
from rallypoint.rendezvous.readiness import Readiness
from rallypoint.settings import Settings
from rallypoint.wire import alive as wirealive
from rallypoint.wire import batch as wirebatch


class ServingNode(Protocol):
    """What the peer API reads of its node (the Rendezvous), as the node's parts are now."""

    spec: ClusterSpec
    settings: Settings
    auth: Authenticator
    metrics: Metrics
    readiness: Readiness
    peers: PeerTable
    offsets: ClockEstimate
    peer_client: PeerClient
    poked: asyncio.Event
    master_target: tuple[str, int] | None
    book: MasterBook | None
    master: Master | None
    relay: Relay | None
    verification: Verification | None
    keepalive: Keepalive | None

    @property
    def spec_known(self) -> bool: ...


class PeerApi:
    """What one node answers on its peer API, read from the node's parts as they are now."""

    def __init__(self, node: ServingNode) -> None:
        self.node = node

    async def handle_join(self, request: wire.JoinRequest, remote: str | None) -> wire.JoinAnswer:
        """Record a worker's join (master or its relay); JoinRejected when refused."""
        serving = self._require_master(relay=True)
        if isinstance(serving, Relay):
            return await serving.handle_join(request, remote)
        return serving.handle_join(request, remote)

    async def handle_joins(self, batch: wirebatch.JoinBatch, remote: str | None) -> wire.JoinAnswer:
        """Record a relay's batch of joins (master only); JoinRejected when refused."""
        return self._require_master().handle_joins(batch, remote)

    async def handle_cluster(self, after: str | None) -> ClusterDoc | None:
        """Long-poll for a document newer than ``after`` (master or relay); None on timeout."""
        return await self._require_master(relay=True).handle_cluster(after)

    def encoded(self, doc: ClusterDoc) -> EncodedDoc:
        """A document handle_cluster returned, encoded once by whoever serves it."""
        if self.node.book is not None:
            return self.node.book.encoded(doc)
        if self.node.relay is not None:
            return self.node.relay.encoded(doc)
        return EncodedDoc.of(doc)

    async def handle_report(self, report: wire.Report, remote: str | None) -> wire.Verdict:
        """Record a node's checks (master or relay); the verdict, long-polled while unchanged."""
        return await self._require_master(relay=True).handle_report(report)

    async def handle_reports(
        self, batch: wirebatch.ReportBatch, remote: str | None
    ) -> wire.Verdict:
        """Record a relay's batch of reports (master only); the verdict, as for one report."""
        return await self._require_master().handle_reports(batch)

    async def handle_alive(
        self, alive: wirealive.Alive, remote: str | None
    ) -> wirealive.AliveAnswer:
        """A peer's keep-alive after ready: noted, and this node's view of who is down."""
        if not self.node.spec_known:
            raise JoinRejected(
                503, "discovering", "this node has not finished mDNS discovery; retry shortly"
            )
        if self.node.keepalive is None:  # --keepalive 0 here: nothing watched, nothing to say
            return wirealive.AliveAnswer(self.node.spec.session, self.node.spec.rank, (), 0)
        return await self.node.keepalive.answer(alive)

    async def handle_poke(self, poke: wire.Poke, remote: str | None) -> None:
        """The master (re)started: cut the join backoff short and retry a failed verification."""
        if poke.session != self.node.spec.session:
            raise JoinRejected(
                409, "session_mismatch", f"poke for session {poke.session!r}, not ours"
            )
        self.node.metrics.pokes_received.inc()
        self.node.poked.set()
        if self.node.verification is not None:
            self.node.verification.retry()

    def clock_refused(self, body: bytes, remote: str | None, skew_s: float) -> None:
        """A peer message was refused as ``skew_s`` ahead of this node's clock: remember whose
        (the host in its authentic body, else the peer joined from ``remote``)."""
        host = sender_host(body, self.node.spec)
        if host is None and remote is not None:
            known = [p.host for p in self.node.peers.values() if p.remote == remote]
            host = known[0] if len(known) == 1 else None
        self.node.offsets.refused(host or remote or "unknown", skew_s)
        if self.node.master is not None and host is not None:
            self.node.master.clock_refused(host, skew_s, self.node.auth.max_skew_s)

    @overload
    def _require_master(self) -> Master: ...

    @overload
    def _require_master(self, *, relay: bool) -> Master | Relay: ...

    def _require_master(self, *, relay: bool = False) -> Master | Relay:
        if not self.node.spec_known:
            raise JoinRejected(
                503,
                "discovering",
                f"this node has not finished mDNS discovery (seen {self._phase_detail()}); "
                "retry shortly",
            )
        if self.node.master is None and relay and self.node.relay is not None:
            return self.node.relay
        if self.node.master is None:
            raise JoinRejected(
                409,
                "not_master",
                f"{self.node.spec.host} is rank {self.node.spec.rank}, not the master; "
                f"talk to {self.node.spec.master}",
            )
        return self.node.master

    def _phase_detail(self) -> str:
        return next(
            (r.detail or "" for r in self.node.readiness.phase if r.code == "discovering"), ""
        )

    async def mesh(self) -> dict[str, object]:
        """The mesh (core/mesh.py): the master's own view; elsewhere asked of the master (or relay).

        MeshUnavailable before this node reached its master (409) or when the ask fails (502).
        """
        if self.node.book is not None:
            return status.mesh_view(self.node.book, self.node.settings)
        target = self.node.master_target
        if target is None:
            raise MeshUnavailable(
                "this node has not reached its master yet, and the mesh is the master's "
                "view: ask again once it joined (`rallypoint status` says why it has not)"
            )
        try:
            return await self.node.peer_client.get_mesh(target)
        except JoinRejected as exc:
            if exc.code != "no_master" or exc.status != 502:
                raise self._mesh_unreachable(exc) from exc
            # Our relay could not ask the master: its message already says so, once.
            raise MeshUnavailable(exc.said, status=502) from exc
        except (PeerDown, AuthError, PeerMessageError) as exc:
            raise self._mesh_unreachable(exc) from exc

    def _mesh_unreachable(self, exc: Exception) -> MeshUnavailable:
        return MeshUnavailable(
            f"cannot get the mesh from the master {self.node.spec.master}: {exc}; is its sidecar "
            "running? (`rallypoint status --mesh` on the master shows it directly)",
            status=502,
        )
