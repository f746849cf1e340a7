"""The peer protocol's route table: what both ends are driven by, and what the docs list."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from rallypoint.rendezvous.peerapi import PeerApi
from rallypoint.server.peer import peer_app
from rallypoint.wire import routes

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def peer_table() -> dict[str, str]:
    """docs/api.md's peer API table: "METHOD PATH" -> who answers."""
    text = API_MD.read_text()
    section = text[text.index("## Peer API") :]
    section = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| `(GET|POST) (/v1/[a-z]+)[^`]*` \| ([^|]+) \|", section, re.M)
    return {f"{method} {path}": served.strip() for method, path, served in rows}


def test_every_route_is_documented_once_with_who_answers_it() -> None:
    documented = peer_table()
    assert set(documented) == {r.context for r in routes.ROUTES}
    for route in routes.ROUTES:
        assert documented[route.context] == route.served_by, route.context


def test_the_server_registers_exactly_the_table() -> None:
    app = peer_app(object(), run_rendezvous=False)  # type: ignore[arg-type]
    registered = {
        f"{r.method} {r.resource.canonical}"
        for r in app.router.routes()
        if r.method != "HEAD" and r.resource is not None
    }
    assert registered == {r.context for r in routes.ROUTES}


@pytest.mark.parametrize("route", [r for r in routes.ROUTES if r.method == "POST"])
def test_every_message_has_an_async_handler_taking_the_message_and_the_caller(
    route: routes.Route,
) -> None:
    assert route.handler is not None
    handler = getattr(PeerApi, route.handler)
    assert inspect.iscoroutinefunction(handler), route.handler
    assert list(inspect.signature(handler).parameters)[2:] == ["remote"], route.handler
    assert route.parse_request is not None and route.answer_limit > 0


def test_every_named_handler_is_the_peer_api_s() -> None:
    named = [r.handler for r in routes.ROUTES if r.handler is not None]
    assert named and all(callable(getattr(PeerApi, name, None)) for name in named), named


def test_signing_contexts() -> None:
    assert routes.JOIN.signed_as() == "POST /v1/join"
    assert routes.CLUSTER.signed_as(None) == "GET /v1/cluster?after="
    assert routes.CLUSTER.signed_as("g1") == "GET /v1/cluster?after=g1"
    assert routes.ALIVE.answered_as == "200 /v1/alive"
    assert len({r.context for r in routes.ROUTES}) == len(routes.ROUTES)
