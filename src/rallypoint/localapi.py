"""The local API, written once: every route of it in one table (pure).

Both ends read it: the server (server/local.py) registers each row with the handler it
names, takes only the row's query parameters (400 for any other) and, for a write, the
session token's proof and a JSON body first (docs/api.md "Writes"); the client
(cli/client.py) takes each path from its row and sends the proof on the writes. A new local
route is one row here and one handler there. docs/api.md and docs/openapi.yaml list the same
routes (tests/unit/test_local_routes.py holds them to this table).
"""

from __future__ import annotations

from typing import Literal

import msgspec

#: What a route's success answers with: JSON, one line of text, the env in the format its
#: query asks for, Prometheus text, or nothing (204).
Answer = Literal["json", "text", "env", "prometheus", "none"]


class LocalRoute(msgspec.Struct, frozen=True):
    """One route of the local API (a Struct: the blocking client imports this on every
    `rallypoint check`, and a Struct costs less to define than a dataclass)."""

    method: Literal["GET", "POST"]
    path: str
    #: The handler's name in server/local.py.
    handler: str
    #: The query parameters it takes; any other is a 400.
    query: tuple[str, ...] = ()
    answer: Answer = "json"
    #: A write: with a session token it must prove it, and it takes application/json.
    write: bool = False

    @property
    def context(self) -> str:
        """The route as messages name it: METHOD PATH."""
        return f"{self.method} {self.path}"


ENV = LocalRoute("GET", "/env", "env", ("format", "wait"), "env")
HOSTFILE = LocalRoute("GET", "/hostfile", "hostfile", ("wait",), "text")
READYZ = LocalRoute("GET", "/readyz", "readyz", answer="text")
LIVEZ = LocalRoute("GET", "/livez", "livez", answer="text")
STATUS = LocalRoute("GET", "/status", "status")
MESH = LocalRoute("GET", "/mesh", "mesh")
METRICS = LocalRoute("GET", "/metrics", "metrics", answer="prometheus")
#: The supervised job on every node; ?after=VERSION&wait=S long-polls for a change.
JOB = LocalRoute("GET", "/job", "job", ("after", "wait"))
#: `rallypoint run` reports its job's start or end; the answer is the job view.
JOB_REPORT = LocalRoute("POST", "/job", "job_report", write=True)
#: `rallypoint run` tells its job's latest progress mark.
PROGRESS = LocalRoute("POST", "/job/progress", "progress_report", answer="none", write=True)

#: Every route, in the order the server registers them.
ROUTES = (ENV, HOSTFILE, READYZ, LIVEZ, STATUS, MESH, METRICS, JOB, JOB_REPORT, PROGRESS)
