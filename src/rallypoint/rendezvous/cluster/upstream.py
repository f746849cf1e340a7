"""A relay's requests to the master: each batch's POST, and what came of it, counted by result.

The relay (relay.py) sends its group's joins and reports through here. The master's refusal
is passed on to the group as it is; a master the relay cannot reach becomes the relay's own
503 refusal, so the group's members join the master directly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rallypoint import wire
from rallypoint.errors import AuthError, JoinRejected, PeerDown, PeerMessageError
from rallypoint.rendezvous.context import NodeContext
from rallypoint.rendezvous.tasks import unless_set
from rallypoint.wire import routes

log = logging.getLogger("rallypoint.rendezvous")

T = TypeVar("T")


class Upstream:
    """One relay's line to the master: where it is, the batches sent, the last failure."""

    def __init__(self, ctx: NodeContext, unavailable: Callable[[str], JoinRejected]) -> None:
        self.ctx = ctx
        #: The relay's refusal to its group, saying why it cannot answer.
        self._unavailable = unavailable
        #: The master's peer API, from this node's own last join.
        self.target: tuple[str, int] | None = None
        #: The last failure to reach the master, for /status.
        self.problem: str | None = None
        self.batches_sent = 0

    async def post_joins(self, body: bytes) -> wire.JoinAnswer:
        return await self.ctx.client.post_join(
            self._target(), body, self.ctx.spec.session, routes.JOINS
        )

    async def post_reports(self, body: bytes) -> wire.Verdict:
        return await self.ctx.client.post_report(self._target(), body, routes.REPORTS)

    async def call(
        self, route: str, send: Awaitable[T], *, interrupt: asyncio.Event | None = None
    ) -> T | JoinRejected | None:
        """One upstream request to ``route``: its answer, the refusal (the master's, or a 503
        for the group when it cannot be reached), or None if ``interrupt`` was set first;
        counted in rallypoint_relay_batches by result."""
        request = await unless_set(send, interrupt)
        batches = self.ctx.metrics.relay_batches
        if request.cancelled():
            batches.labels(route, "interrupted").inc()
            return None
        try:
            answer = request.result()
        except JoinRejected as exc:
            self.problem = str(exc)
            batches.labels(route, exc.code).inc()
            return exc  # the master's own refusal: the member gets its word
        except (PeerDown, AuthError, PeerMessageError) as exc:
            self.problem = str(exc)
            batches.labels(route, "unreachable").inc()
            log.info("relay_upstream_failed", extra={"error": str(exc)})
            return self._unavailable(f"it cannot reach the master: {exc}")
        self.problem = None
        self.batches_sent += 1
        batches.labels(route, "accepted").inc()
        return answer

    def _target(self) -> tuple[str, int]:
        if self.target is None:
            raise PeerDown("the master's peer API address is not known yet")
        return self.target
