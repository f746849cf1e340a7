"""The only module importing aiohttp.web: the local API and the peer API of one sidecar.

The local API (loopback only by default) serves this container's env and the node's status.
The peer API serves what peers need and nothing else: join, the cluster document, a
data-less readiness answer and pokes. With a token every peer request, and the master's
join answers and cluster documents, carry an HMAC signature (auth.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from rallypoint import hostfile, render, wire
from rallypoint.errors import AuthError, HostfileError, JoinRejected, PeerMessageError, PortError
from rallypoint.metrics import CONTENT_TYPE
from rallypoint.reasons import Reason, auth_reason
from rallypoint.rendezvous import Rendezvous
from rallypoint.settings import Settings

log = logging.getLogger(__name__)

NODE = web.AppKey("node", Rendezvous)
TASK = web.AppKey("rendezvous_task", asyncio.Task[None])

#: Requests to the local API carry no body.
LOCAL_MAX_BYTES = 1024
#: A join body is a few hundred bytes; anything near this is not a peer of ours.
PEER_MAX_BYTES = 64 * 1024
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
#: ?wait= is capped so an idle client cannot hold a connection forever; clients loop.
MAX_WAIT_S = 300.0
#: A peer that stops mid-body is answered 408 after this, so it cannot pin a handler.
BODY_TIMEOUT_S = 5.0
#: After answering early (408, 413), unread body bytes are drained this long, not aiohttp's 10 s.
LINGER_S = 1.0

#: The default peer host; with it the peer API also listens on IPV6_ANY (v6-only socket).
IPV4_ANY = "0.0.0.0"
IPV6_ANY = "::"

_NO_STORE = {"Cache-Control": "no-store"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(status: int, message: str, code: str | None = None) -> web.Response:
    """A one-line JSON error: {"error": message[, "code": code]}."""
    body: dict[str, str] = {"error": message}
    if code is not None:
        body["code"] = code
    return web.json_response(body, status=status, headers=_NO_STORE)


def _observe(api: str) -> Middleware:
    """Middleware: map rallypoint errors to answers and count every request."""

    @web.middleware
    async def middleware(request: web.Request, handler: _Handler) -> web.StreamResponse:
        node = request.app[NODE]
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        try:
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:
            response = error_response(413, exc.text or "request body too large", "too_large")
        except web.HTTPException as exc:
            node.metrics.request_counter(api, route, exc.status).inc()
            raise
        except AuthError as exc:
            node.metrics.auth_failures.labels(auth_reason(exc)).inc()
            log.warning("auth_rejected route=%s remote=%s error=%s", route, request.remote, exc)
            response = error_response(401, str(exc), "auth_failed")
        except JoinRejected as exc:
            response = error_response(exc.status, str(exc), exc.code)
        except PeerMessageError as exc:
            response = error_response(400, str(exc), "bad_request")
        node.metrics.request_counter(api, route, response.status).inc()
        return response

    return middleware


# -- local API ------------------------------------------------------------------------------


def local_app(node: Rendezvous) -> web.Application:
    """The local API: /env, /hostfile, /readyz, /livez, /status, /metrics."""
    app = web.Application(client_max_size=LOCAL_MAX_BYTES, middlewares=[_observe("local")])
    app[NODE] = node
    app.router.add_get("/env", _env)
    app.router.add_get("/hostfile", _hostfile)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/livez", _livez)
    app.router.add_get("/status", _status)
    app.router.add_get("/metrics", _metrics)
    return app


def _not_ready(reasons: list[Reason]) -> web.Response:
    body = {"ready": False, "reasons": [r.as_json() for r in reasons]}
    return web.json_response(body, status=503, headers=_NO_STORE)


def _single(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query as a dict; PeerMessageError-free 400s for unknown or repeated parameters."""
    query = request.query
    for key in query:
        if key not in allowed:
            raise web.HTTPBadRequest(
                text=_json_line(f"unknown query parameter {key!r}; use {', '.join(allowed)}"),
                content_type="application/json",
            )
        if len(query.getall(key)) > 1:
            raise web.HTTPBadRequest(
                text=_json_line(f"query parameter {key!r} given more than once"),
                content_type="application/json",
            )
    return {key: query[key] for key in query}


def _json_line(message: str, code: str | None = None) -> str:
    return json.dumps({"error": message} if code is None else {"error": message, "code": code})


#: /env's constant headers per format (Content-Type spelled out: the body is ready bytes).
_ENV_HEADERS = {
    "json": {**_NO_STORE, "Content-Type": "application/json; charset=utf-8"},
    "sh": {**_NO_STORE, "Content-Type": "text/plain; charset=utf-8"},
    "dotenv": {**_NO_STORE, "Content-Type": "text/plain; charset=utf-8"},
}


async def _wait_param(request: web.Request, params: dict[str, str]) -> web.Response | None:
    """Long-poll for readiness when ?wait= asks for it; a 400 answer when it is malformed."""
    if "wait" not in params:
        return None
    try:
        wait_s = float(params["wait"])
    except ValueError:
        wait_s = math.nan
    if not math.isfinite(wait_s) or wait_s < 0:
        return error_response(
            400, f"wait={params['wait']!r:.40} must be a number of seconds, 0 or more"
        )
    await request.app[NODE].wait_ready(min(wait_s, MAX_WAIT_S))
    return None


async def _env(request: web.Request) -> web.Response:
    node = request.app[NODE]
    # Most calls carry no query: skip parsing it.
    params = _single(request, ("format", "wait")) if request.query_string else {}
    fmt = params.get("format", "json")
    if fmt not in render.FORMATS:
        return error_response(400, f"format {fmt!r} is not one of {', '.join(render.FORMATS)}")
    bad_wait = await _wait_param(request, params)
    if bad_wait is not None:
        return bad_wait
    env = node.env
    if not node.ready or env is None:
        return _not_ready(node.reasons())
    headers = dict(_ENV_HEADERS[fmt])
    headers["X-Rallypoint-Generation"] = node.generation or ""
    # Rendered once per (env, format): json's indent=2 takes the pure-Python encoder.
    return web.Response(body=render.render_bytes(env.values, fmt), headers=headers)


async def _hostfile(request: web.Request) -> web.Response:
    """The nodes as ``host slots=N`` lines in rank order (DeepSpeed, Open MPI), when ready."""
    node = request.app[NODE]
    params = _single(request, ("wait",)) if request.query_string else {}
    bad_wait = await _wait_param(request, params)
    if bad_wait is not None:
        return bad_wait
    env = node.env
    if not node.ready or env is None:
        return _not_ready(node.reasons())
    try:
        slot_count = hostfile.slots(env.as_dict(), node.settings.nproc_per_node)
        text = hostfile.render(node.spec.hosts, slot_count)
    except HostfileError as exc:
        return error_response(409, str(exc), "no_hostfile")
    headers = dict(_ENV_HEADERS["sh"])
    headers["X-Rallypoint-Generation"] = node.generation or ""
    return web.Response(body=text.encode(), headers=headers)


async def _readyz(request: web.Request) -> web.Response:
    node = request.app[NODE]
    if node.ready:
        return web.Response(text="ready\n", headers=_NO_STORE)
    reasons = node.reasons()
    first = reasons[0] if reasons else Reason("starting", "the sidecar is starting")
    more = f" (+{len(reasons) - 1} more, see /status)" if len(reasons) > 1 else ""
    return web.Response(
        status=503, text=f"not ready: {first.code}: {first.message}{more}\n", headers=_NO_STORE
    )


async def _livez(request: web.Request) -> web.Response:
    return web.Response(text="ok\n", headers=_NO_STORE)


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[NODE].status(), headers=_NO_STORE)


async def _metrics(request: web.Request) -> web.Response:
    headers = dict(_NO_STORE)
    headers["Content-Type"] = CONTENT_TYPE
    return web.Response(body=request.app[NODE].metrics.render(), headers=headers)


# -- peer API -------------------------------------------------------------------------------


def peer_app(node: Rendezvous, *, run_rendezvous: bool = True) -> web.Application:
    """The peer API; with ``run_rendezvous`` the state machine runs as its background task."""
    app = web.Application(client_max_size=PEER_MAX_BYTES, middlewares=[_observe("peer")])
    app[NODE] = node
    app.router.add_post("/v1/join", _join)
    app.router.add_get("/v1/cluster", _cluster)
    app.router.add_get("/v1/ready", _ready)
    app.router.add_post("/v1/poke", _poke)
    app.router.add_post("/v1/report", _report)
    if run_rendezvous:
        app.cleanup_ctx.append(_rendezvous_task)
    return app


async def _rendezvous_task(app: web.Application) -> AsyncIterator[None]:
    node = app[NODE]
    # Before mDNS discovery the spec has no host yet: name the task after the session.
    task = asyncio.create_task(node.run(), name=f"rendezvous-{node.spec.session}")
    task.add_done_callback(_report_crash(node))
    app[TASK] = task
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _report_crash(node: Rendezvous) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        exc = task.exception()
        log.error("rendezvous_crashed error=%r", exc, exc_info=exc)
        node.fail(Reason("internal_error", f"the rendezvous stopped: {exc!r}; see the log"))

    return done


async def _read_body(request: web.Request) -> bytes:
    """The whole body within BODY_TIMEOUT_S: 408 past it, 400 if the client breaks off."""
    try:
        if request.content.is_eof():
            # The whole body came with the headers (the usual case): read() cannot wait,
            # so no timer is armed (arming one was ~6 % of a 4096-node master's CPU).
            return await request.read()
        async with asyncio.timeout(BODY_TIMEOUT_S):
            return await request.read()
    except TimeoutError:
        log.debug("body_timeout route=%s remote=%s", request.path, request.remote)
        raise web.HTTPRequestTimeout(
            text=_json_line(
                f"the request body did not arrive within {BODY_TIMEOUT_S:g}s", "body_timeout"
            ),
            content_type="application/json",
        ) from None
    except (ConnectionResetError, HttpProcessingError) as exc:
        # The client left (or broke the framing) mid-body: nobody reads the answer, and
        # aiohttp would log the error with a traceback if it escaped the handler.
        log.debug("body_broken route=%s remote=%s error=%r", request.path, request.remote, exc)
        raise web.HTTPBadRequest(
            text=_json_line("the request body ended before its declared length", "bad_request"),
            content_type="application/json",
        ) from None


async def _join(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await _read_body(request)
    node.auth.verify("POST /v1/join", body, request.headers)
    answer = node.handle_join(wire.parse_join(body), request.remote)
    return _signed(node, "200 /v1/join", wire.encode_join_answer(answer))


async def _cluster(request: web.Request) -> web.Response:
    node = request.app[NODE]
    params = _single(request, ("after",))
    after = params.get("after")
    node.auth.verify(f"GET /v1/cluster?after={after or ''}", b"", request.headers)
    if after is not None:
        wire.generation(after, "after")
    doc = await node.handle_cluster(after)
    book = node.book  # never None here: handle_cluster answers on the master only
    if doc is None or book is None:
        return web.Response(status=204, headers=_NO_STORE)
    # The book encoded, hashed and gzipped the document once when it issued it: per answer
    # only a fresh signature (own timestamp and nonce) over that digest, never O(N) work.
    encoded = book.encoded(doc)
    headers = dict(_NO_STORE)
    headers.update(node.auth.sign_digest("200 /v1/cluster", encoded.sha256))
    payload = encoded.body
    if encoded.gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
        if wire.accepts_gzip(request.headers.get("Accept-Encoding", "")):
            # The signature covers the decoded body, which HTTP clients hand back.
            headers["Content-Encoding"] = "gzip"
            payload = encoded.gzipped
    return web.Response(body=payload, content_type="application/json", headers=headers)


async def _ready(request: web.Request) -> web.Response:
    node = request.app[NODE]
    node.auth.verify("GET /v1/ready", b"", request.headers)
    return web.json_response({"ready": node.ready}, headers=_NO_STORE)


async def _poke(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await _read_body(request)
    node.auth.verify("POST /v1/poke", body, request.headers)
    node.handle_poke(wire.parse_poke(body))
    return web.Response(status=204, headers=_NO_STORE)


async def _report(request: web.Request) -> web.Response:
    node = request.app[NODE]
    body = await _read_body(request)
    node.auth.verify("POST /v1/report", body, request.headers)
    verdict = await node.handle_report(wire.parse_report(body))
    return _signed(node, "200 /v1/report", wire.encode_verdict(verdict))


def _signed(node: Rendezvous, context: str, payload: bytes) -> web.Response:
    headers = dict(_NO_STORE)
    headers.update(node.auth.sign(context, payload))
    return web.Response(body=payload, content_type="application/json", headers=headers)


# -- listeners ------------------------------------------------------------------------------


def _quiet_protocol_errors(record: logging.LogRecord) -> bool:
    """Logging filter: a request aiohttp's parser refused becomes one debug line, no traceback.

    Anyone who reaches the peer port can send such requests; an ERROR with a traceback
    for each would let them fill the log. Every other record passes unchanged.
    """
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, HttpProcessingError):
        return True
    remote = record.args[0] if isinstance(record.args, tuple) and record.args else None
    log.debug("bad_http_request remote=%s status=%s error=%.200r", remote, exc.code, exc.message)
    return False


def peer_keepalive_s(nnodes: int) -> float:
    """The peer API's keep-alive (and first-request) timeout for a cluster of nnodes.

    Capped at KEEPALIVE_MAX_S: an idle or half-sent connection is still closed in bounded
    time, only later in a large cluster (5.1 s at 64 nodes, 37.8 s at 16384).
    """
    return min(KEEPALIVE_S + KEEPALIVE_PER_NODE_S * max(nnodes, 0), KEEPALIVE_MAX_S)


class Listeners:
    """Both APIs bound with AppRunner + TCPSite; an async context manager, closing twice is safe."""

    def __init__(self, node: Rendezvous, settings: Settings) -> None:
        self.node = node
        self.settings = settings
        #: (host, port) pairs actually listening, for logs and tests.
        self.local_bound: list[tuple[str, int]] = []
        self.peer_bound: list[tuple[str, int]] = []
        self._runners: list[web.AppRunner] = []

    async def __aenter__(self) -> Listeners:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def start(self) -> None:
        """Bind the local API on every local host, then the peer API (starts the rendezvous)."""
        settings = self.settings
        # A /env?wait whose client left stops waiting at once (aiohttp leaves it off).
        local = await self._runner(local_app(self.node), handler_cancellation=True)
        for host in settings.local_hosts:
            if await self._bind(local, host, settings.local_port, "local", quiet_v6=True):
                self.local_bound.append((host, settings.local_port))
        peer = await self._runner(
            peer_app(self.node),
            handler_cancellation=False,
            keepalive_s=peer_keepalive_s(self.node.spec.nnodes),
        )
        await self._bind(peer, settings.peer_host, settings.peer_port, "peer", quiet_v6=False)
        self.peer_bound.append((settings.peer_host, settings.peer_port))
        # The wildcard means every address, as it does for gRPC: on an IPv6-only or
        # dual-stack network peers may reach this node over IPv6 only.
        if settings.peer_host == IPV4_ANY and await self._bind(
            peer, IPV6_ANY, settings.peer_port, "peer", quiet_v6=True
        ):
            self.peer_bound.append((IPV6_ANY, settings.peer_port))
        log.info(
            "listening local=%s peer=%s",
            ",".join(f"{h}:{p}" for h, p in self.local_bound),
            ",".join(f"{h}:{p}" for h, p in self.peer_bound),
        )

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
        http_log = logging.getLogger(f"{__name__}.http")
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
                log.debug("ipv6_unavailable api=%s host=%s error=%s", api, host, exc)
                return False
            raise PortError(
                f"cannot listen for the {api} API on {host}:{port}: {exc.strerror or exc}; "
                f"free the port or choose another with RALLYPOINT_{api.upper()}_PORT"
            ) from exc
        return True
