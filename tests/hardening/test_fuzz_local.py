"""Hypothesis over the query strings of every local route, against a real in-process listener.

Every generated request must end in a documented answer (docs/openapi.yaml) within the
request timeout: no 500, no traceback in the answer or the log, no stuck handler.
"""

from __future__ import annotations

import json
import string
from urllib.parse import quote, urlencode

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from rallypoint.served import render
from tests.hardening.harness import Node, Records, Reply, assert_clean, fuzz, raw_exchange, request

#: What each local route may answer. 400/414/431 also come from aiohttp's HTTP parser
#: (request line or header too long), before any handler runs.
PROTOCOL = (400, 414, 431)
ALLOWED = {
    "/env": (200, 400, 503, *PROTOCOL),
    "/readyz": (200, 503, *PROTOCOL),
    "/livez": (200, *PROTOCOL),
    "/status": (200, *PROTOCOL),
    "/mesh": (200, 409, 502, *PROTOCOL),
    "/metrics": (200, *PROTOCOL),
}
ROUTES = sorted(ALLOWED)

KEYS = st.one_of(
    st.sampled_from(["format", "wait", "after", "verbose", "", "FORMAT", "wait[]", "format "]),
    st.text(max_size=20),
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["1e999", "-0", "0x10", "1_000", " 1", "1 ", "nan", "-inf", "\u0661"]),
)
HUGE = st.integers(min_value=1000, max_value=20000).map(lambda n: "9" * n)
VALUES = st.one_of(
    st.sampled_from(["json", "sh", "dotenv", "xml", "", "JSON", "json\x00"]),
    NUMBERS,
    st.text(max_size=200),
    HUGE,
)
QUERIES = st.lists(st.tuples(KEYS, VALUES), max_size=5)


def check_local(reply: Reply, route: str, what: str) -> None:
    """The answer is one that docs/openapi.yaml lists for ``route``, well-formed."""
    assert_clean(reply, ALLOWED[route], what)
    if reply.status == 400 and reply.content_type == "application/json":
        error = json.loads(reply.body)
        assert isinstance(error["error"], str) and "\n" not in error["error"], what
    if route == "/env" and reply.status == 200 and reply.content_type == "application/json":
        env = json.loads(reply.body)
        assert env and all(isinstance(v, str) for v in env.values()), what
    if reply.status == 503 and route == "/env":
        assert json.loads(reply.body)["ready"] is False, what


@fuzz(1.0)
@given(route=st.sampled_from(ROUTES), query=QUERIES)
@example(route="/env", query=[("wait", "1e308")])
@example(route="/env", query=[("wait", "9" * 400)])
@example(route="/env", query=[("format", "json"), ("format", "json")])
@example(route="/env", query=[("wait", "nan"), ("format", "sh")])
@example(route="/status", query=[("x", "9" * 20000)])
def test_local_query_strings(
    ready_node: Node, logs: Records, route: str, query: list[tuple[str, str]]
) -> None:
    target = f"{route}?{urlencode(query)}" if query else route
    reply = request(ready_node.local_port, "GET", target)
    check_local(reply, route, f"GET {target[:200]}")
    assert not logs.crashes()


# Raw query text: whatever bytes a client may put after "?" on the request line.
RAW_QUERY = st.text(
    alphabet=st.sampled_from(string.ascii_letters + string.digits + "%&=+;?/[]#.-_~!$'()*,:@"),
    max_size=300,
)


@fuzz(0.5)
@given(route=st.sampled_from(ROUTES), raw=RAW_QUERY)
@example(route="/env", raw="format=%ff%fe")
@example(route="/env", raw="wait=%00")
@example(route="/env", raw="%zz=1&&&==")
def test_local_raw_query_text(ready_node: Node, logs: Records, route: str, raw: str) -> None:
    reply = request(ready_node.local_port, "GET", f"{route}?{raw}")
    check_local(reply, route, f"GET {route}?{raw!r}")
    assert not logs.crashes()


@fuzz(0.25)
@given(
    route=st.sampled_from(ROUTES),
    method=st.sampled_from(["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW"]),
    body=st.binary(max_size=2048),
)
def test_local_other_methods_and_bodies(
    ready_node: Node, logs: Records, route: str, method: str, body: bytes
) -> None:
    """The local API is GET only: anything else is 405 (or 413 over its 1 KiB body limit)."""
    reply = request(ready_node.local_port, method, route, body=body or None)
    assert_clean(reply, (200, 405, 413, 400), f"{method} {route}")
    if method not in ("HEAD", "BREW"):  # aiohttp's parser refuses unknown methods with 400
        assert reply.status == 405, f"{method} {route} answered {reply.status}"
    assert not logs.crashes()


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "raw",
    [
        "wait=" + "9" * 9000,  # request line over aiohttp's 8190-byte limit
        "format=" + quote("\udcff", errors="surrogatepass"),
        "format=%C3%28",  # invalid UTF-8 after percent-decoding
        "wait=1&wait=2&wait=3",
    ],
    ids=["line-too-long", "surrogate", "bad-utf8", "repeated"],
)
def test_local_hostile_query_table(ready_node: Node, logs: Records, route: str, raw: str) -> None:
    data = f"GET {route}?{raw} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    reply = raw_exchange(ready_node.local_port, data)
    check_local(reply, route, f"GET {route}?{raw[:60]}")
    assert not logs.crashes()


@pytest.mark.parametrize("fmt", render.FORMATS)
def test_env_formats_still_serve_after_fuzzing(ready_node: Node, fmt: str) -> None:
    """The node survived the fuzzing above: it still serves every format."""
    reply = request(ready_node.local_port, "GET", f"/env?format={fmt}&wait=1")
    assert reply.status == 200
    assert b"MASTER_PORT" in reply.body


def test_protocol_errors_do_not_log_tracebacks(ready_node: Node, logs: Records) -> None:
    for port in (ready_node.local_port, ready_node.peer_port):
        for data in (
            b"GET /livez?" + b"x" * 9000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"BREW /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ):
            reply = raw_exchange(port, data)
            assert_clean(reply, PROTOCOL, repr(data[:20]))
    assert not logs.parser_errors(), logs.parser_errors()
