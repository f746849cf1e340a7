"""The only package importing aiohttp.web: the local API and the peer API of one sidecar.

The local API (loopback only by default) serves this container's env and the node's status
(local.py). The peer API serves what peers need and nothing else: join, the cluster document,
a data-less readiness answer and pokes (peer.py). With a token every peer request, and the
master's join answers and cluster documents, carry an HMAC signature (auth.py). With
--metrics-port a third listener serves /metrics alone to a cluster's Prometheus (scrape.py).
All share one middleware and error shape (common.py); this module binds them (Listeners).
"""

from __future__ import annotations

import errno
import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from rallypoint.core.lifecycle import AsyncResource
from rallypoint.errors import PortError
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.common import log
from rallypoint.server.local import local_app
from rallypoint.server.peer import peer_app
from rallypoint.server.scrape import metrics_app
from rallypoint.settings import Settings

KEEPALIVE_S = 5.0
#: Added per node to the peer API's keep-alive timeout, which aiohttp also applies to a fresh
#: connection's first request: in a herd the master reaches a connection only after the
#: requests queued before it (~0.4-0.6 ms each measured), and with 5 s alone 16384
#: simultaneous joins lost every connection not served within 5 s of its accept.
KEEPALIVE_PER_NODE_S = 0.002
KEEPALIVE_MAX_S = 60.0
#: Listen backlog, capped by the kernel at net.core.somaxconn (4096 by default since Linux
#: 5.4): a herd of joins arrives at once, and where the operator raised somaxconn for a
#: larger cluster the sidecar should not be the lower cap.
BACKLOG = 65535
#: After answering early (408, 413), unread body bytes are drained this long, not aiohttp's 10 s.
LINGER_S = 1.0

#: The default peer host; with it the peer API also listens on IPV6_ANY (v6-only socket).
IPV4_ANY = "0.0.0.0"
IPV6_ANY = "::"


def _quiet_protocol_errors(record: logging.LogRecord) -> bool:
    """Logging filter: a request aiohttp's parser refused becomes one debug line, no traceback.

    Anyone who reaches the peer port can send such requests; an ERROR with a traceback
    for each would let them fill the log. Every other record passes unchanged.
    """
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True
    remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
    log.debug(
        "bad_http_request",
        extra={"remote": remote, "status": exc.code, "error": repr(exc.message)[:200]},
    )
    return False


def peer_keepalive_s(nnodes: int) -> float:
    """The peer API's keep-alive (and first-request) timeout for a cluster of nnodes.

    Capped at KEEPALIVE_MAX_S: an idle or half-sent connection is still closed in bounded
    time, only later in a large cluster (5.1 s at 64 nodes, 37.8 s at 16384).
    """
    return min(KEEPALIVE_S + KEEPALIVE_PER_NODE_S * max(nnodes, 0), KEEPALIVE_MAX_S)


class Listeners(AsyncResource):
    """Every listener bound with AppRunner + TCPSite; an async context manager, closing twice
    is safe."""

    def __init__(self, node: Rendezvous, settings: Settings) -> None:
        self.node = node
        self.settings = settings
        #: (host, port) pairs actually listening, for logs and tests.
        self.local_bound: list[tuple[str, int]] = []
        self.peer_bound: list[tuple[str, int]] = []
        self.metrics_bound: list[tuple[str, int]] = []
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        """Bind the local API on every local host, the metrics listener when asked, then the
        peer API (starts the rendezvous)."""
        settings = self.settings
        # A /env?wait whose client left stops waiting at once (aiohttp leaves it off).
        local = await self._runner(local_app(self.node), handler_cancellation=True)
        for host in settings.local_hosts:
            if await self._bind(local, host, settings.local_port, "local", quiet_v6=True):
                self.local_bound.append((host, settings.local_port))
        if settings.metrics_port is not None:
            scrape = await self._runner(metrics_app(self.node), handler_cancellation=True)
            self.metrics_bound = await self._wildcard(
                scrape, settings.metrics_host, settings.metrics_port, "metrics"
            )
        peer = await self._runner(
            peer_app(self.node),
            handler_cancellation=False,
            keepalive_s=peer_keepalive_s(self.node.spec.nnodes),
        )
        self.peer_bound = await self._wildcard(peer, settings.peer_host, settings.peer_port, "peer")
        extra = {
            "local": ",".join(f"{h}:{p}" for h, p in self.local_bound),
            "peer": ",".join(f"{h}:{p}" for h, p in self.peer_bound),
        }
        if self.metrics_bound:
            extra["metrics"] = ",".join(f"{h}:{p}" for h, p in self.metrics_bound)
        log.info("listening", extra=extra)

    async def _wildcard(
        self, runner: web.AppRunner, host: str, port: int, api: str
    ) -> list[tuple[str, int]]:
        """Bind host:port, and with the IPv4 wildcard also the IPv6 one when the host has it.

        The wildcard means every address, as it does for gRPC: on an IPv6-only or dual-stack
        network peers (and Prometheus) may reach this node over IPv6 only. The pairs bound.
        """
        await self._bind(runner, host, port, api, quiet_v6=False)
        bound = [(host, port)]
        if host == IPV4_ANY and await self._bind(runner, IPV6_ANY, port, api, quiet_v6=True):
            bound.append((IPV6_ANY, port))
        return bound

    async def close(self) -> None:
        """Stop listening and cancel the rendezvous, within shutdown_grace_s."""
        runners, self._runners = self._runners, []
        for runner in reversed(runners):
            await runner.cleanup()

    async def _runner(
        self,
        app: web.Application,
        *,
        handler_cancellation: bool,
        keepalive_s: float = KEEPALIVE_S,
    ) -> web.AppRunner:
        http_log = logging.getLogger("rallypoint.server.http")
        http_log.addFilter(_quiet_protocol_errors)  # a no-op when already there
        runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            logger=http_log,
            handler_cancellation=handler_cancellation,
            lingering_time=LINGER_S,
            keepalive_timeout=keepalive_s,
            shutdown_timeout=self.settings.shutdown_grace_s,
        )
        await runner.setup()
        self._runners.append(runner)
        return runner

    async def _bind(
        self, runner: web.AppRunner, host: str, port: int, api: str, *, quiet_v6: bool
    ) -> bool:
        site = web.TCPSite(runner, host, port, backlog=BACKLOG, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            if quiet_v6 and ":" in host and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                log.debug("ipv6_unavailable", extra={"api": api, "host": host, "error": str(exc)})
                return False
            raise PortError(
                f"cannot listen for the {api} API on {host}:{port}: {exc.strerror or exc}; "
                f"free the port or choose another with RALLYPOINT_{api.upper()}_PORT"
            ) from exc
        return True
