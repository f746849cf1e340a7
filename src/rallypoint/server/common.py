"""What both APIs share: the node's app key, JSON answers and one-line errors (wire/local.py's
types), query checks, the middleware that maps errors to answers."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from rallypoint.auth import NONCE_HEADER
from rallypoint.errors import AuthError, JoinRejected, MeshUnavailable, PeerMessageError
from rallypoint.reasons import auth_reason
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.wire import local
from rallypoint.wire.fields import dump

# The server logs under one name, whichever module of it speaks.
log = logging.getLogger("rallypoint.server")

NODE = web.AppKey("node", Rendezvous)

NO_STORE = {"Cache-Control": "no-store"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def api_app(
    node: Rendezvous, api: str, max_bytes: int, routes: list[web.RouteDef]
) -> web.Application:
    """One API's application: its body limit, the shared middleware, the node and its routes."""
    app = web.Application(client_max_size=max_bytes, middlewares=[observe(api)])
    app[NODE] = node
    app.add_routes(routes)
    return app


def json_answer(answer: object, status: int = 200) -> web.Response:
    """A JSON answer: a wire/local.py type (or builtins holding them), uncached."""
    return web.json_response(msgspec.to_builtins(answer), status=status, headers=NO_STORE)


def error_response(status: int, message: str, code: str | None = None) -> web.Response:
    """A one-line JSON error: {"error": message[, "code": code]} (wire/local.ErrorAnswer)."""
    return json_answer(local.ErrorAnswer(message, code), status)


def observe(api: str) -> Middleware:
    """Middleware: map rallypoint errors to answers and count every request."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        node = request.app[NODE]
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        received = node.offsets.now()  # t2 of a refusal's clock stamp (clock_refusal)
        try:
            response = await handler(request)
        except web.HTTPRequestEntityTooLarge as exc:
            response = error_response(413, exc.text or "request body too large", "too_large")
        except web.HTTPException as exc:
            node.metrics.request_counter(api, route, exc.status).inc()
            raise
        except AuthError as exc:
            node.metrics.auth_failures.labels(auth_reason(exc)).inc()
            log.warning(
                "auth_rejected", extra={"route": route, "remote": request.remote, "error": str(exc)}
            )
            response = error_response(401, str(exc), "auth_failed")
            if exc.skew_s is not None:
                response = await clock_refusal(node, request, exc.skew_s, received, str(exc))
        except JoinRejected as exc:
            response = error_response(exc.status, str(exc), exc.code)
        except MeshUnavailable as exc:  # both APIs' /mesh: the master is not reached yet
            response = error_response(exc.status, str(exc), "no_master")
        except PeerMessageError as exc:
            response = error_response(400, str(exc), "bad_request")
        node.metrics.request_counter(api, route, response.status).inc()
        return response

    return middleware


async def clock_refusal(
    node: Rendezvous, request: web.Request, skew_s: float, received: float, message: str
) -> web.Response:
    """The 401 for a message refused for its timestamp alone: it carries this node's clock and
    echoes the request's nonce, signed, so the sender can correct its clock and retry
    (docs/readiness.md#clocks); the sender's skew is recorded (its host comes from the body,
    which proved authentic before its timestamp was judged)."""
    # The handler read the body already (read() returns it again); a GET has none.
    body = await request.read() if request.body_exists else b""
    node.peer_api.clock_refused(body, request.remote, skew_s)
    out: dict[str, object] = {
        "error": message,
        "code": "auth_failed",
        "reason": "stale",
        "skew_s": round(skew_s, 3),
    }
    stamp = node.offsets.stamp(received, request.headers.get(NONCE_HEADER))
    if stamp is not None:
        out["clock"] = stamp
    payload = dump(out)
    headers = dict(NO_STORE)
    headers.update(node.auth.sign(f"401 {request.path}", payload))
    return web.Response(status=401, body=payload, content_type="application/json", headers=headers)


def single_query(request: web.Request, allowed: tuple[str, ...]) -> dict[str, str]:
    """The query as a dict; PeerMessageError-free 400s for unknown or repeated parameters."""
    query = request.query
    for key in query:
        if key not in allowed:
            raise web.HTTPBadRequest(
                text=json_line(f"unknown query parameter {key!r}; use {', '.join(allowed)}"),
                content_type="application/json",
            )
        if len(query.getall(key)) > 1:
            raise web.HTTPBadRequest(
                text=json_line(f"query parameter {key!r} given more than once"),
                content_type="application/json",
            )
    return {key: query[key] for key in query}


def json_line(message: str, code: str | None = None) -> str:
    """The body of a one-line JSON error, for aiohttp's HTTP exceptions."""
    return json.dumps(msgspec.to_builtins(local.ErrorAnswer(message, code)))
