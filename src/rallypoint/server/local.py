"""The local API (loopback only by default), its routes registered from localapi.py:
/env, /hostfile, /readyz, /livez, /status, /mesh, /metrics, and /job (what `rallypoint run`
reports and waits on, and its job's progress)."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from rallypoint import localapi
from rallypoint.auth import LOCAL_PROOF_HEADER
from rallypoint.errors import AuthError, HostfileError
from rallypoint.model import Env
from rallypoint.reasons import Reason, auth_reason
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.served import hostfile, render
from rallypoint.server.common import (
    NO_STORE,
    NODE,
    Handler,
    api_app,
    error_response,
    json_answer,
    single_query,
)
from rallypoint.server.scrape import metrics
from rallypoint.wire import jobstates, local

#: Requests to the local API carry no body.
LOCAL_MAX_BYTES = 1024
#: ?wait= is capped so an idle client cannot hold a connection forever; clients loop.
MAX_WAIT_S = 300.0


def local_app(node: Rendezvous) -> web.Application:
    """The local API: every row of localapi.py with the handler it names."""
    handlers = {
        "env": _env,
        "hostfile": _hostfile,
        "readyz": _readyz,
        "livez": _livez,
        "status": _status,
        "mesh": _mesh,
        "metrics": metrics,
        "job": _job,
        "job_report": _job_report,
        "progress_report": _progress_report,
    }
    return api_app(
        node,
        "local",
        LOCAL_MAX_BYTES,
        [_registered(route, handlers[route.handler]) for route in localapi.ROUTES],
    )


def _registered(route: localapi.LocalRoute[Any], handler: Handler) -> web.RouteDef:
    """A row as aiohttp's route: a GET also answers HEAD, a write is refused before its
    handler runs unless it proves the token and carries JSON (_refused)."""
    if route.method == "GET":
        return web.get(route.path, handler)

    async def write(request: web.Request) -> web.StreamResponse:
        refused = _refused(request)
        return refused if refused is not None else await handler(request)

    return web.route(route.method, route.path, write)


def _query(request: web.Request, route: localapi.LocalRoute[Any]) -> dict[str, str]:
    """The row's query parameters (400 for any other); most calls carry none."""
    return single_query(request, route.query) if request.query_string else {}


def _not_ready(reasons: list[Reason]) -> web.Response:
    return json_answer(local.NotReadyAnswer(False, tuple(reasons)), 503)


def _discovering() -> web.Response:
    """The 503 of the job's routes before mDNS discovery assigned the ranks."""
    return error_response(503, "the node list is not known yet (mDNS discovery)", "discovering")


#: /env's constant headers per format (Content-Type spelled out: the body is ready bytes).
_ENV_HEADERS = {
    "json": {**NO_STORE, "Content-Type": "application/json; charset=utf-8"},
    "sh": {**NO_STORE, "Content-Type": "text/plain; charset=utf-8"},
    "dotenv": {**NO_STORE, "Content-Type": "text/plain; charset=utf-8"},
}


def _wait_s(params: dict[str, str]) -> float | web.Response:
    """?wait= in seconds (capped at MAX_WAIT_S), or the 400 for a bad one."""
    try:
        wait_s = float(params.get("wait", "0"))
    except ValueError:
        wait_s = math.nan
    if not math.isfinite(wait_s) or wait_s < 0:
        return error_response(
            400, f"wait={params['wait']!r:.40} must be a number of seconds, 0 or more"
        )
    return min(wait_s, MAX_WAIT_S)


async def _ready_env(request: web.Request, params: dict[str, str]) -> Env | web.Response:
    """The env to serve once ?wait= is honoured, or the answer: 400 bad wait, 503 not ready."""
    readiness = request.app[NODE].readiness
    if "wait" in params:
        wait_s = _wait_s(params)
        if isinstance(wait_s, web.Response):
            return wait_s
        await readiness.wait_ready(wait_s)
    env = readiness.env
    if not readiness.ready or env is None:
        return _not_ready(readiness.reasons())
    return env


def _generation(node: Rendezvous) -> str:
    """The X-Rallypoint-Generation header: the current document's generation, "" before one."""
    return "" if node.verification is None else node.verification.generation or ""


async def _env(request: web.Request) -> web.Response:
    node = request.app[NODE]
    params = _query(request, localapi.ENV)
    fmt = params.get("format", "json")
    if fmt not in render.FORMATS:
        return error_response(400, f"format {fmt!r} is not one of {', '.join(render.FORMATS)}")
    env = await _ready_env(request, params)
    if isinstance(env, web.Response):
        return env
    headers = dict(_ENV_HEADERS[fmt])
    headers["X-Rallypoint-Generation"] = _generation(node)
    # Rendered once per (env, format): json's indent=2 takes the pure-Python encoder.
    return web.Response(body=render.render_bytes(env.values, fmt), headers=headers)


async def _hostfile(request: web.Request) -> web.Response:
    """The nodes as ``host slots=N`` lines in rank order (DeepSpeed, Open MPI), when ready."""
    node = request.app[NODE]
    params = _query(request, localapi.HOSTFILE)
    env = await _ready_env(request, params)
    if isinstance(env, web.Response):
        return env
    try:
        slot_count = hostfile.slots(env.as_dict(), node.settings.nproc_per_node)
        text = hostfile.render(node.spec.hosts, slot_count)
    except HostfileError as exc:
        return error_response(409, str(exc), "no_hostfile")
    headers = dict(_ENV_HEADERS["sh"])
    headers["X-Rallypoint-Generation"] = _generation(node)
    return web.Response(body=text.encode(), headers=headers)


async def _readyz(request: web.Request) -> web.Response:
    readiness = request.app[NODE].readiness
    if readiness.ready:
        return web.Response(text="ready\n", headers=NO_STORE)
    reasons = readiness.reasons()
    first = reasons[0] if reasons else Reason("starting", "the sidecar is starting")
    more = f" (+{len(reasons) - 1} more, see /status)" if len(reasons) > 1 else ""
    return web.Response(
        status=503, text=f"not ready: {first.code}: {first.message}{more}\n", headers=NO_STORE
    )


async def _livez(request: web.Request) -> web.Response:
    return web.Response(text="ok\n", headers=NO_STORE)


async def _status(request: web.Request) -> web.Response:
    return json_answer(request.app[NODE].status())


async def _mesh(request: web.Request) -> web.Response:
    """The mesh (core/mesh.py): the master's view, which any other node asks the master for
    (MeshUnavailable: the middleware's 409 or 502)."""
    return json_answer(await request.app[NODE].peer_api.mesh())


async def _job(request: web.Request) -> web.Response:
    """The supervised job on every node; ?after=VERSION&wait=S long-polls for a change."""
    node = request.app[NODE]
    params = _query(request, localapi.JOB)
    if node.jobs is None:
        return _discovering()
    wait_s = _wait_s(params)
    if isinstance(wait_s, web.Response):
        return wait_s
    if "after" in params:
        try:
            after = int(params["after"])
        except ValueError:
            return error_response(400, f"after={params['after']!r:.40} must be a version number")
        await node.jobs.wait(after, wait_s)
    return json_answer(node.jobs.view())


def _refused(request: web.Request) -> web.Response | None:
    """Why a report from `run` (POST /job, /job/progress) cannot be taken; None: it can."""
    node = request.app[NODE]
    # With a session token, a write proves it (`run` has it): another user of a shared host
    # cannot stop this session's job. Reads stay open on loopback.
    try:
        node.auth.check_local(request.headers.get(LOCAL_PROOF_HEADER))
    except AuthError as exc:
        node.metrics.auth_failures.labels(auth_reason(exc)).inc()
        return error_response(403, f"POST {request.path}: {exc}", "forbidden")
    # JSON only: a web page cannot send that without a CORS preflight, which nothing answers,
    # so no page a browser on this host opens can stop the cluster's job.
    if request.content_type != "application/json":
        return error_response(415, f"POST {request.path} takes application/json", "bad_request")
    if node.jobs is None or node.progress is None:
        return _discovering()
    return None


async def _job_report(request: web.Request) -> web.Response:
    """`rallypoint run` reports its job's start or end; the answer is the job view."""
    node = request.app[NODE]
    assert node.jobs is not None  # _refused said so
    report = jobstates.parse_report(await request.read())
    await node.jobs.report(report, settle_s=min(node.settings.keepalive_s or 1.0, 5.0))
    return json_answer(node.jobs.view())


async def _progress_report(request: web.Request) -> web.Response:
    """`rallypoint run` tells its job's latest progress mark; it rides the next keep-alive."""
    progress = request.app[NODE].progress
    assert progress is not None  # _refused said so
    progress.mine(jobstates.parse_progress(await request.read()))
    return web.Response(status=204, headers=NO_STORE)
