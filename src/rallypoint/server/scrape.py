"""The metrics listener: GET /metrics and nothing else, for a cluster's Prometheus.

The local API stays on loopback because it serves the env and the whole /status; a
Prometheus outside the container needs the exposition only. With --metrics-port this
listener serves it on the cluster's network (docs/monitoring.md): any other path is a
404, and nothing it answers carries the env, the status or the token.
"""

from __future__ import annotations

from aiohttp import web

from rallypoint.metrics import content_type
from rallypoint.rendezvous.node import Rendezvous
from rallypoint.server.common import NO_STORE, NODE, api_app

#: A scrape carries no body.
SCRAPE_MAX_BYTES = 1024


def metrics_app(node: Rendezvous) -> web.Application:
    """The metrics listener's application: GET (and HEAD) /metrics."""
    return api_app(node, "metrics", SCRAPE_MAX_BYTES, [web.get("/metrics", metrics)])


async def metrics(request: web.Request) -> web.Response:
    """The Prometheus text exposition of the node's registry (both listeners serve it)."""
    headers = dict(NO_STORE)
    headers["Content-Type"] = content_type()
    return web.Response(body=request.app[NODE].metrics.render(), headers=headers)
