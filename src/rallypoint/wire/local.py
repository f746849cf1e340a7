"""The local API's answers, typed once (pure): server/local.py sends them, cli/client.py
decodes them into the same types.

Each JSON route of the local API names its answer type in its row (localapi.py). The server
writes a type's builtins (``msgspec.to_builtins``) as aiohttp always wrote the local API's
dicts, so the JSON on the wire keeps its field names, its order and its nulls; the client
decodes an answer with msgspec, which checks every field (``wire/fields.load``, up to
MAX_ANSWER_BYTES). The job view's types are with the job's other wire forms, in
wire/jobstates.py.
"""

from __future__ import annotations

from typing import Any

import msgspec

from rallypoint.model import Nodes, Rank
from rallypoint.reasons import Reason
from rallypoint.wire.jobstates import JobView

#: GET /env?format=json: the contract's variables, names to values.
EnvValues = dict[str, str]


class ErrorAnswer(msgspec.Struct, frozen=True, omit_defaults=True):
    """Every refusal of either API: one line, and a stable code when there is one."""

    error: str
    code: str | None = None


class NotReadyAnswer(msgspec.Struct, frozen=True):
    """The 503 of /env and /hostfile: why the node is not ready."""

    ready: bool = False
    reasons: tuple[Reason, ...] = ()


class StatusSpec(msgspec.Struct, frozen=True):
    """/status "spec": the cluster spec this node works from."""

    provider: str = ""
    session: str = ""
    hosts: tuple[str, ...] = ()
    rank: Rank = 0
    nnodes: Nodes = 0
    master: str | None = None


class StatusView(msgspec.Struct, frozen=True):
    """GET /status as the CLI reads it: readiness, the spec and the job typed; the sections
    it only renders kept as the JSON they are (the whole document is `status --json`'s).
    The head is UNSET where a document leaves it out (a section that failed to render)."""

    ready: bool
    reasons: tuple[Reason, ...] = ()
    generation: str | msgspec.UnsetType | None = msgspec.UNSET
    role: str | msgspec.UnsetType = msgspec.UNSET
    spec: StatusSpec | msgspec.UnsetType = msgspec.UNSET
    peers: tuple[dict[str, Any], ...] = ()
    overrides: tuple[dict[str, Any], ...] = ()
    warnings: tuple[Any, ...] = ()
    ports: dict[str, Any] = {}
    auth: dict[str, Any] = {}
    checks: dict[str, Any] = {}
    liveness: dict[str, Any] = {}
    job: JobView | None = None


#: The largest answer the client decodes (a 4096-node master's /status is a few MiB).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
