"""The peer protocol, written once: every route of the peer API in one table (pure).

Both ends are driven by it: the server (server/peer.py) registers each row and, for a
message route, reads the body, checks its signature over "METHOD PATH", parses it, hands it
to the node's handler, stamps the answer with this node's clock where the row says so, and
signs it; the client (net/peerhttp.py) signs the request the same way, reads at most the row's
answer limit, checks the answer's signature and status, takes its clock sample and parses
it. A new message is one row here and one handler on the node (rendezvous/peerapi.py).

Any peer holding the session's token may call any route; a row says who answers it, and a
node asked what it does not serve says so (409 ``not_master``, 503 ``discovering``).
docs/api.md lists the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.wire import alive, batch, cluster, fields

#: Which of the client's deadlines a route's request runs under: one exchange
#: (``--resolve-timeout``), a long-poll (``--long-poll`` plus one exchange), twice an
#: exchange (the mesh, which a relay fetches from its master first), or one the caller gives.
Deadline = Literal["exchange", "long_poll", "two_exchanges", "caller"]


@dataclass(frozen=True)
class Route:
    """One route of the peer API."""

    method: Literal["GET", "POST"]
    path: str
    #: The name of the method that answers it (rendezvous/peerapi.PeerApi.<handler>); None
    #: for what the server answers from the node's state alone (readiness).
    handler: str | None
    #: The request body's parser (None: no body, a GET).
    parse_request: Callable[[bytes], Any] | None = None
    #: The answer's encoder (None: 204, no answer) and parser.
    encode_answer: Callable[[Any], bytes] | None = None
    parse_answer: Callable[[bytes], Any] | None = None
    #: The largest answer a client reads (1 KiB leaves an answerless route room for an error).
    answer_limit: int = 1024
    #: The client's deadline for the request: most routes take one exchange.
    deadline: Deadline = "exchange"
    #: Whether the answer carries this node's clock stamp (a sample for the asker's offset).
    stamped: bool = False
    #: The one query parameter the signature covers, when the route takes one.
    query: str | None = None
    #: Who answers it, as docs/api.md's peer table says (the node's handler enforces it:
    #: a node asked what it does not serve answers 409 or 503 with the reason).
    served_by: str = ""

    @property
    def context(self) -> str:
        """What a request's signature covers besides its body (with the query, if any)."""
        return f"{self.method} {self.path}"

    def signed_as(self, value: str | None = None) -> str:
        """The request's signing context, with the query's value when the route has one."""
        if self.query is None:
            return self.context
        return f"{self.context}?{self.query}={value or ''}"

    @property
    def answered_as(self) -> str:
        """What an answer's signature covers besides its body."""
        return f"200 {self.path}"


#: A worker's join (a relay's member's too), to the master or its relay.
JOIN = Route(
    "POST", "/v1/join", "handle_join", wire.parse_join, wire.encode_join_answer,
    wire.parse_join_answer, wire.MAX_JOIN_BYTES, stamped=True,
    served_by="master, or a relay for its group",
)  # fmt: skip
#: A relay's batch of its group's joins, to the master.
JOINS = Route(
    "POST", "/v1/joins", "handle_joins", batch.parse_join_batch, wire.encode_join_answer,
    wire.parse_join_answer, wire.MAX_JOIN_BYTES, stamped=True,
    served_by="master",
)  # fmt: skip
#: The cluster document as a long-poll: a newer one, or 204 when the poll timed out.
CLUSTER = Route(
    "GET", "/v1/cluster", "handle_cluster", None, cluster.encode_cluster_doc,
    cluster.parse_cluster_doc, cluster.MAX_DOC_BYTES, "long_poll", query="after",
    served_by="master, or a relay for its group",
)  # fmt: skip
#: Whether the answering node is ready.
READY = Route("GET", "/v1/ready", None, served_by="any")
#: The master's "re-join now" to a worker (204).
POKE = Route(
    "POST", "/v1/poke", "handle_poke", wire.parse_poke, deadline="caller", served_by="worker"
)
#: A node's checks of one generation, a long-poll: the verdict once it differs from the one seen.
REPORT = Route(
    "POST", "/v1/report", "handle_report", wire.parse_report, wire.encode_verdict,
    wire.parse_verdict, wire.MAX_REPORT_BYTES, "long_poll", stamped=True,
    served_by="master, or a relay for its group",
)  # fmt: skip
#: A relay's batch of its group's reports, a long-poll like REPORT.
REPORTS = Route(
    "POST", "/v1/reports", "handle_reports", batch.parse_report_batch, wire.encode_verdict,
    wire.parse_verdict, wire.MAX_REPORT_BYTES, "long_poll", stamped=True,
    served_by="master",
)  # fmt: skip
#: A keep-alive after ready, carrying the supervised job's states both ways.
ALIVE = Route(
    "POST", "/v1/alive", "handle_alive", alive.parse_alive, alive.encode_answer,
    alive.parse_answer, alive.MAX_ANSWER_BYTES, "caller",
    served_by="every node, after its first ready (or once its `run` reported)",
)  # fmt: skip
#: The largest mesh answer a node takes from its master (GET /v1/mesh).
MAX_MESH_BYTES = 4 * 1024 * 1024


def parse_mesh(body: bytes) -> dict[str, object]:
    """A mesh answer (core/mesh.py's view): a JSON object with its counts (it is shown, not
    acted on)."""
    data = fields.load(body, dict[str, object], MAX_MESH_BYTES, "mesh")
    if not isinstance(data.get("counts"), dict) or not isinstance(data.get("nnodes"), int):
        raise PeerMessageError("mesh: counts and nnodes are missing")
    return data


#: The master's mesh view (a relay asks its master).
MESH = Route(
    "GET", "/v1/mesh", "mesh", None, fields.dump, parse_mesh, MAX_MESH_BYTES, "two_exchanges",
    served_by="master, or a relay (which asks its master)",
)  # fmt: skip

#: Every route, in the order the server registers them.
ROUTES = (JOIN, JOINS, CLUSTER, READY, POKE, REPORT, REPORTS, ALIVE, MESH)
