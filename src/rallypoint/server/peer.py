"""The peer API, registered from the route table (wire/routes.py); signed with a token."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from rallypoint.auth import NONCE_HEADER
from rallypoint.core.clock import ClockStamp
from rallypoint.reasons import Reason
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.common import (
    NO_STORE,
    NODE,
    api_app,
    json_line,
    log,
    single_query,
)
from rallypoint.wire import cluster, fields, routes

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
TASK = web.AppKey("rendezvous_task", asyncio.Task[None])

#: A join body is a few hundred bytes; anything near this is not a peer of ours.
PEER_MAX_BYTES = 64 * 1024
#: A peer that stops mid-body is answered 408 after this, so it cannot pin a handler.
BODY_TIMEOUT_S = 5.0


def peer_app(node: Rendezvous, *, run_rendezvous: bool = True) -> web.Application:
    """The peer API; with ``run_rendezvous`` the state machine runs as its background task."""
    app = api_app(
        node,
        "peer",
        PEER_MAX_BYTES,
        [web.route(r.method, r.path, _handler(r)) for r in routes.ROUTES],
    )
    if run_rendezvous:
        app.cleanup_ctx.append(_rendezvous_task)
    return app


def _handler(route: routes.Route) -> Handler:
    """The GET routes are answered each its own way (a long-poll of a document encoded once,
    a plain JSON answer, a view fetched upstream); every POST route is a message."""
    custom = {routes.CLUSTER: _cluster, routes.READY: _ready, routes.MESH: _mesh}
    return custom.get(route) or _message(route)


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
        log.error("rendezvous_crashed", extra={"error": repr(exc)}, exc_info=exc)
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
        log.debug("body_timeout", extra={"route": request.path, "remote": request.remote})
        raise web.HTTPRequestTimeout(
            text=json_line(
                f"the request body did not arrive within {BODY_TIMEOUT_S:g}s", "body_timeout"
            ),
            content_type="application/json",
        ) from None
    except (ConnectionResetError, HttpProcessingError) as exc:
        # The client left (or broke the framing) mid-body: nobody reads the answer, and
        # aiohttp would log the error with a traceback if it escaped the handler.
        log.debug(
            "body_broken",
            extra={"route": request.path, "remote": request.remote, "error": repr(exc)},
        )
        raise web.HTTPBadRequest(
            text=json_line("the request body ended before its declared length", "bad_request"),
            content_type="application/json",
        ) from None


def _message(route: routes.Route) -> Handler:
    """The handler of a message route: body, signature, parse, the node's handler, answer."""
    parse, handler = route.parse_request, route.handler
    assert parse is not None and handler is not None

    async def handle(request: web.Request) -> web.Response:
        node = request.app[NODE]
        received = node.offsets.now()
        body = await _read_body(request)
        node.auth.verify(route.context, body, request.headers)
        serve = getattr(node.peer_api, handler)
        answer = await serve(parse(body), request.remote)
        if route.encode_answer is None:
            return web.Response(status=204, headers=NO_STORE)
        if route.stamped:
            answer = msgspec.structs.replace(answer, clock=_stamp(request, received))
        return _signed(node, route.answered_as, route.encode_answer(answer))

    return handle


async def _cluster(request: web.Request) -> web.Response:
    node = request.app[NODE]
    params = single_query(request, ("after",))
    after = params.get("after")
    node.auth.verify(routes.CLUSTER.signed_as(after), b"", request.headers)
    if after is not None:
        fields.generation(after, "after")
    doc = await node.peer_api.handle_cluster(after)
    if doc is None:
        return web.Response(status=204, headers=NO_STORE)
    # The master (or relay) encoded, hashed and gzipped the document once: per answer only a
    # fresh signature (own timestamp and nonce) over that digest, never O(N) work.
    encoded = node.peer_api.encoded(doc)
    headers = dict(NO_STORE)
    headers.update(node.auth.sign_digest(routes.CLUSTER.answered_as, encoded.sha256))
    payload = encoded.body
    if encoded.gzipped is not None:
        headers["Vary"] = "Accept-Encoding"
        if cluster.accepts_gzip(request.headers.get("Accept-Encoding", "")):
            # The signature covers the decoded body, which HTTP clients hand back.
            headers["Content-Encoding"] = "gzip"
            payload = encoded.gzipped
    return web.Response(body=payload, content_type="application/json", headers=headers)


async def _ready(request: web.Request) -> web.Response:
    node = request.app[NODE]
    node.auth.verify(routes.READY.context, b"", request.headers)
    return web.json_response({"ready": node.readiness.ready}, headers=NO_STORE)


async def _mesh(request: web.Request) -> web.Response:
    """The master's mesh view (a relay asks its master), signed like every answer."""
    node = request.app[NODE]
    node.auth.verify(routes.MESH.context, b"", request.headers)
    view = await node.peer_api.mesh()  # MeshUnavailable: the middleware's 409 or 502
    return _signed(node, routes.MESH.answered_as, fields.dump(view))


def _stamp(request: web.Request, received: float) -> ClockStamp | None:
    """This node's clock for the answer (always replaced: a relay passes on the master's
    answer to its own batch, whose stamp belongs to that exchange, not to this one)."""
    node = request.app[NODE]
    nonce = request.headers.get(NONCE_HEADER) if node.auth.enabled else None  # checked then
    return node.offsets.stamp(received, nonce)


def _signed(node: Rendezvous, context: str, payload: bytes) -> web.Response:
    headers = dict(NO_STORE)
    headers.update(node.auth.sign(context, payload))
    return web.Response(body=payload, content_type="application/json", headers=headers)
