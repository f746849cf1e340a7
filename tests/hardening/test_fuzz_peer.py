"""Malformed, oversized and truncated peer messages against a real in-process peer API.

The peer API listens on the cluster interface, so everything here is what any host on the
network can send. Each input must end in a documented error (docs/openapi.yaml) or a valid
result, answered within the request timeout, without a traceback in the answer or the log.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml  # type: ignore[import-untyped]
from hypothesis import example, given
from hypothesis import strategies as st

from rallypoint import server
from rallypoint.errors import PeerMessageError
from rallypoint.server.peer import PEER_MAX_BYTES
from rallypoint.wire import cluster
from tests.hardening.harness import (
    SESSION,
    Node,
    Records,
    Reply,
    assert_clean,
    fuzz,
    raw_exchange,
    readable,
    request,
)

OPENAPI = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml").read_text()
)
#: What aiohttp's HTTP parser may answer before any handler runs.
PROTOCOL = (400,)
ALLOWED = {
    ("POST", "/v1/join"): (200, 400, 401, 403, 409, 413),
    ("POST", "/v1/poke"): (204, 400, 401, 409, 413),
    ("GET", "/v1/cluster"): (200, 204, 400, 401, 409),
    ("GET", "/v1/ready"): (200, 401),
    ("POST", "/v1/report"): (200, 400, 401, 403, 409, 413),
}
#: How long the server may take to give up on a client that stopped sending mid-request.
READ_BOUND_S = server.KEEPALIVE_S + 5.0

JSON_ANY = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
SESSIONS = st.one_of(st.just(SESSION), st.sampled_from(["", "other", " " + SESSION]), JSON_ANY)
RANKS = st.one_of(st.integers(-3, 5), st.integers(), st.booleans(), st.floats(), JSON_ANY)
HOSTS = st.one_of(
    st.sampled_from(
        ["node0", "node1", "node2", "NODE1", "evil", "127.0.0.1", "::1", "", "a" * 300]
    ),
    st.text(max_size=80),
    JSON_ANY,
)
ADDRESS = st.one_of(
    st.sampled_from(["127.0.0.1", "198.51.100.7", "::1", "fe80::1%eth0", "256.1.1.1", "0.0.0.0"]),
    st.ip_addresses().map(str),
    st.text(max_size=50),
    JSON_ANY,
)
ADDRESSES = st.one_of(st.lists(ADDRESS, max_size=70), JSON_ANY)
PORTS = st.one_of(st.none(), st.integers(-2, 70000), JSON_ANY)
TOKENS = st.one_of(st.none(), st.text(max_size=70), JSON_ANY)
JOIN_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "session": SESSIONS,
        "rank": RANKS,
        "host": HOSTS,
        "addresses": ADDRESSES,
        "tf_port": PORTS,
        "generation_seen": TOKENS,
        "extra": JSON_ANY,
    },
)
POKE_FIELDS = st.fixed_dictionaries({}, optional={"session": SESSIONS, "epoch": TOKENS})
FAILURE = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "code": st.one_of(st.sampled_from(["peer_unreachable", "X", ""]), JSON_ANY),
            "message": st.one_of(st.text(max_size=60), st.just("m" * 1001), JSON_ANY),
            "host": HOSTS,
            "detail": st.one_of(st.none(), st.text(max_size=40), JSON_ANY),
            "ranks": st.one_of(st.lists(RANKS, max_size=4), JSON_ANY),
        },
    ),
    JSON_ANY,
)
REPORT_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "session": SESSIONS,
        "generation": TOKENS,
        "rank": RANKS,
        "host": HOSTS,
        "passed": st.one_of(st.booleans(), JSON_ANY),
        "failures": st.one_of(st.lists(FAILURE, max_size=40), JSON_ANY),
        "busy": st.one_of(st.lists(st.sampled_from(["master", "tf", "x"]), max_size=4), JSON_ANY),
        "net": st.one_of(
            st.fixed_dictionaries({}, optional={"ifname": TOKENS, "mtu": PORTS, "rdma": JSON_ANY}),
            JSON_ANY,
        ),
        "seen": st.one_of(st.integers(-5, 5), JSON_ANY),
    },
)
JUNK = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    JSON_ANY.map(lambda v: json.dumps(v).encode()),
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "",
    ]
)


def dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def check_peer(reply: Reply, method: str, path: str, what: str) -> None:
    assert_clean(reply, ALLOWED[(method, path)], what)
    if reply.status >= 400:
        assert reply.content_type == "application/json", f"{what}: {reply.content_type}"
        assert isinstance(json.loads(reply.body)["error"], str), what


@fuzz(1.0)
@given(
    body=st.one_of(JOIN_FIELDS.map(dumps), JUNK),
    content_type=CONTENT_TYPES,
)
@example(body=b"[" * 100_000, content_type="application/json")
@example(body=b'{"a":' * 50_000, content_type="application/json")
@example(body=dumps({"addresses": ["127.0.0.1"] * 5000}), content_type="application/json")
@example(body=b"\xff\xfe\x00{", content_type="application/json")
@example(body=b"x" * (PEER_MAX_BYTES + 1), content_type="application/json")
@example(body=b"", content_type="")
@example(body=b'{"rank": 1e400, "session": NaN}', content_type="application/json")
def test_join_bodies(waiting_master: Node, logs: Records, body: bytes, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    reply = request(waiting_master.peer_port, "POST", "/v1/join", body=body, headers=headers)
    check_peer(reply, "POST", "/v1/join", f"join {body[:120]!r}")
    assert not logs.crashes()


@fuzz(0.5)
@given(body=st.one_of(POKE_FIELDS.map(dumps), JUNK))
@example(body=b"[" * 100_000)
@example(body=dumps({"session": SESSION, "epoch": "e" * 65}))
def test_poke_bodies(ready_node: Node, logs: Records, body: bytes) -> None:
    reply = request(ready_node.peer_port, "POST", "/v1/poke", body=body)
    check_peer(reply, "POST", "/v1/poke", f"poke {body[:120]!r}")
    assert not logs.crashes()


@fuzz(0.5)
@given(body=st.one_of(REPORT_FIELDS.map(dumps), JUNK))
@example(body=b"[" * 100_000)
@example(
    body=dumps(
        {
            "session": SESSION,
            "generation": "g",
            "rank": 0,
            "host": "node0",
            "passed": True,
            "failures": [{"code": "a", "message": "m"}] * 33,
        }
    )
)
def test_report_bodies(ready_node: Node, logs: Records, body: bytes) -> None:
    reply = request(ready_node.peer_port, "POST", "/v1/report", body=body)
    check_peer(reply, "POST", "/v1/report", f"report {body[:120]!r}")
    assert not logs.crashes()


@fuzz(0.5)
@given(
    path=st.sampled_from(["/v1/cluster", "/v1/ready"]),
    query=st.lists(
        st.tuples(st.sampled_from(["after", "x", ""]), st.text(max_size=80)), max_size=3
    ),
)
@example(path="/v1/cluster", query=[("after", "a" * 65)])
@example(path="/v1/cluster", query=[("after", "x"), ("after", "y")])
def test_peer_get_queries(
    ready_node: Node, logs: Records, path: str, query: list[tuple[str, str]]
) -> None:
    target = f"{path}?{urlencode(query)}" if query else path
    reply = request(ready_node.peer_port, "GET", target)
    check_peer(reply, "GET", path, f"GET {target[:120]}")
    assert not logs.crashes()


@fuzz(0.5)
@given(
    doc=st.one_of(
        JSON_ANY,
        st.fixed_dictionaries(
            {},
            optional={
                "session": SESSIONS,
                "generation": TOKENS,
                "master_host": HOSTS,
                "master_port": PORTS,
                "members": st.one_of(st.lists(JOIN_FIELDS, max_size=4), JSON_ANY),
            },
        ),
    ).map(dumps)
    | JUNK
)
def test_cluster_documents_parse_or_fail_cleanly(doc: bytes) -> None:
    """What a worker does with a master's answer: a ClusterDoc or PeerMessageError, nothing else."""
    try:
        parsed = cluster.parse_cluster_doc(doc)
    except PeerMessageError as exc:
        assert "\n" not in str(exc)
        return
    assert parsed.members[0].host == parsed.master_host
    assert [m.rank for m in parsed.members] == list(range(len(parsed.members)))


# -- transport-level abuse --------------------------------------------------------------------


def join_head(length: int | str, extra: str = "") -> bytes:
    return (
        f"POST /v1/join HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\nConnection: close\r\n{extra}\r\n"
    ).encode()


@pytest.mark.parametrize(
    "data",
    [
        join_head(-1) + b"{}",
        join_head("abc") + b"{}",
        join_head(2, "Content-Length: 3\r\n") + b"{}",
        join_head(2, "Transfer-Encoding: chunked\r\n") + b"0\r\n\r\n",
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"zz\r\n{}\r\n0\r\n\r\n",
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        + b"Connection: close\r\n\r\nffff\r\n"
        + b"x" * 0xFFFF
        + b"\r\n0\r\n\r\n",
        join_head(PEER_MAX_BYTES + 10) + b"x" * (PEER_MAX_BYTES + 10),
        b"POST /v1/join HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 9000 + b"\r\n\r\n",
        b"POST /v1/join HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(200)) + b"\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64,  # a TLS ClientHello
    ],
    ids=[
        "negative-length",
        "text-length",
        "two-lengths",
        "length-and-chunked",
        "bad-chunk-size",
        "chunked-over-limit",
        "length-over-limit",
        "huge-header",
        "many-headers",
        "tls",
    ],
)
def test_malformed_http(waiting_master: Node, logs: Records, data: bytes) -> None:
    """Broken framing never makes a join: a 4xx, or the connection is closed."""
    reply = raw_exchange(waiting_master.peer_port, data, timeout_s=READ_BOUND_S)
    if reply.status:  # the server may also just close the connection
        assert_clean(reply, (400, 413, 431), f"{data[:60]!r}")
    assert not logs.crashes()


def test_odd_but_valid_host_header(ready_node: Node, logs: Records) -> None:
    data = b"GET /v1/ready HTTP/1.1\r\nHost: \xff\xfe\r\nConnection: close\r\n\r\n"
    reply = raw_exchange(ready_node.peer_port, data)
    assert_clean(reply, (200, 400), "non-UTF-8 Host header")
    assert not logs.crashes()


def test_truncated_body_then_close(waiting_master: Node, logs: Records) -> None:
    """Content-Length 1000, 10 bytes sent, write side closed: answered or dropped, no crash."""
    with socket.create_connection(("127.0.0.1", waiting_master.peer_port), 10) as sock:
        sock.sendall(join_head(1000) + b'{"session"')
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(65536)
    assert b"500" not in answer.split(b"\r\n", 1)[0]
    time.sleep(0.2)
    assert not logs.crashes()


def open_connections_to(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (server side), from /proc."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # ESTABLISHED
                count += 1
    return count


HALF_SENT = {
    "join": join_head(1000) + b'{"session"',
    "poke": join_head(1000).replace(b"/v1/join", b"/v1/poke") + b'{"se',
    "join-chunked": b"POST /v1/join HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b'5\r\n{"ses',
}


def test_truncated_body_kept_open_is_bounded(waiting_master: Node) -> None:
    """A client that stops mid-body and keeps the socket open is cut off within a bound.

    Otherwise every such connection pins a handler (and a socket) forever: any host on
    the cluster network can exhaust the peer API's file descriptors.
    """
    port = waiting_master.peer_port
    socks = {
        (kind, i): socket.create_connection(("127.0.0.1", port), 10)
        for kind in HALF_SENT
        for i in range(10)
    }
    try:
        for (kind, _), sock in socks.items():
            sock.sendall(HALF_SENT[kind])
        time.sleep(READ_BOUND_S)
        ready = readable(list(socks.values()), 0.5)
        held = sorted({kind for (kind, _), sock in socks.items() if sock not in ready})
        for sock in ready:
            answer = sock.recv(65536)
            assert b" 500 " not in answer.split(b"\r\n", 1)[0]
        assert not held, f"half-sent bodies still held open after {READ_BOUND_S:g}s: {held}"
    finally:
        for sock in socks.values():
            sock.close()


def test_openapi_documents_every_status_the_peer_api_answers() -> None:
    """ALLOWED above is no wider than docs/openapi.yaml (plus aiohttp's protocol 400)."""
    undocumented = []
    for (method, path), statuses in ALLOWED.items():
        declared = {int(s) for s in OPENAPI["paths"][path][method.lower()]["responses"]}
        undocumented += [f"{method} {path} {s}" for s in statuses if s not in declared]
    assert not undocumented, f"answered but not in docs/openapi.yaml: {undocumented}"
