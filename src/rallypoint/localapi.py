"""The local API, written once: every route of it in one table (pure).

Both ends read it: the server (server/local.py) registers each row with the handler it
names, takes only the row's query parameters (400 for any other) and, for a write, the
session token's proof and a JSON body first (docs/api.md "Writes"), and writes the row's
answer type; the client (cli/client.py) takes each path from its row, sends the proof on the
writes and decodes the answer into the row's type (wire/local.py holds the types). A new
local route is one row here and one handler there. docs/api.md and docs/openapi.yaml list the same
routes (tests/unit/test_local_routes.py holds them to this table).
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec

from rallypoint.wire.jobstates import JobView
from rallypoint.wire.local import EnvValues, StatusView

T = TypeVar("T")

#: What a route's success answers with: JSON, one line of text, the env in the format its
#: query asks for, Prometheus text, or nothing (204).
Answer = Literal["json", "text", "env", "prometheus", "none"]


class LocalRoute(msgspec.Struct, Generic[T], frozen=True):
    """One route of the local API (a Struct: the blocking client imports this on every
    `rallypoint check`, and a Struct costs less to define than a dataclass), answering a
    ``T`` (its ``body``) when its answer is JSON."""

    method: Literal["GET", "POST"]
    path: str
    #: The handler's name in server/local.py.
    handler: str
    #: The query parameters it takes; any other is a 400.
    query: tuple[str, ...] = ()
    answer: Answer = "json"
    #: A write: with a session token it must prove it, and it takes application/json.
    write: bool = False
    #: The type its JSON answer decodes into (/env's: with ?format=json); None: not JSON.
    body: type[T] | None = None
    #: The statuses that carry the answer (/status answers 503 while not ready).
    answered: tuple[int, ...] = (200,)
    #: Not ready, it answers 503 with the reasons (wire/local.NotReadyAnswer, or one line).
    gated: bool = False

    @property
    def context(self) -> str:
        """The route as messages name it: METHOD PATH."""
        return f"{self.method} {self.path}"


ENV: LocalRoute[EnvValues] = LocalRoute(
    "GET", "/env", "env", ("format", "wait"), "env", body=EnvValues, gated=True
)
HOSTFILE: LocalRoute[None] = LocalRoute(
    "GET", "/hostfile", "hostfile", ("wait",), "text", gated=True
)
READYZ: LocalRoute[None] = LocalRoute("GET", "/readyz", "readyz", answer="text", gated=True)
LIVEZ: LocalRoute[None] = LocalRoute("GET", "/livez", "livez", answer="text")
STATUS = LocalRoute("GET", "/status", "status", body=StatusView, answered=(200, 503))
#: The mesh is core/mesh.py's view, shown and not acted on: a JSON object.
MESH: LocalRoute[dict[str, Any]] = LocalRoute("GET", "/mesh", "mesh", body=dict[str, Any])
METRICS: LocalRoute[None] = LocalRoute("GET", "/metrics", "metrics", answer="prometheus")
#: The supervised job on every node; ?after=VERSION&wait=S long-polls for a change.
JOB = LocalRoute("GET", "/job", "job", ("after", "wait"), body=JobView)
#: `rallypoint run` reports its job's start or end; the answer is the job view.
JOB_REPORT = LocalRoute("POST", "/job", "job_report", write=True, body=JobView)
#: `rallypoint run` tells its job's latest progress mark.
PROGRESS: LocalRoute[None] = LocalRoute(
    "POST", "/job/progress", "progress_report", answer="none", write=True, answered=(204,)
)

#: Every route, in the order the server registers them.
ROUTES: tuple[LocalRoute[Any], ...] = (
    ENV,
    HOSTFILE,
    READYZ,
    LIVEZ,
    STATUS,
    MESH,
    METRICS,
    JOB,
    JOB_REPORT,
    PROGRESS,
)
