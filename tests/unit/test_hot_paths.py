"""The cached and fast paths behind the benchmarks give the same answers as the slow ones."""

from __future__ import annotations

import gzip
import hashlib
import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.auth import NONCE_HEADER, Authenticator
from rallypoint.errors import AuthError, PeerMessageError
from rallypoint.metrics import Metrics
from rallypoint.model import ClusterSpec, Member
from rallypoint.rendezvous.cluster.masterbook import GZIP_MIN_BYTES, MasterBook
from rallypoint.served import render
from rallypoint.wire import cluster, fields

TOKEN = "s3cret-token"
BODY = b'{"members": []}'


def test_sign_digest_verifies_like_sign() -> None:
    signer, checker = Authenticator(TOKEN), Authenticator(TOKEN)
    digest = hashlib.sha256(BODY).digest()
    first = signer.sign_digest("200 /v1/cluster", digest)
    second = signer.sign_digest("200 /v1/cluster", digest)
    checker.verify("200 /v1/cluster", BODY, first)
    checker.verify("200 /v1/cluster", BODY, second)
    # Each answer carries its own nonce: a worker's replay cache accepts every one once.
    assert first[NONCE_HEADER] != second[NONCE_HEADER]
    with pytest.raises(AuthError):
        checker.verify(
            "200 /v1/cluster", BODY + b" ", signer.sign_digest("200 /v1/cluster", digest)
        )
    with pytest.raises(AuthError):
        checker.verify("200 /v1/cluster", BODY, first)


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_sign_digest_wants_a_sha256_digest(size: int) -> None:
    with pytest.raises(ValueError, match="32-byte"):
        Authenticator(TOKEN).sign_digest("200 /v1/cluster", b"\0" * size)


def test_sign_digest_without_a_token_signs_nothing() -> None:
    assert Authenticator(None).sign_digest("200 /v1/cluster", b"") == {}


def _book(nnodes: int) -> MasterBook:
    hosts = tuple(f"node-{rank:05d}.cluster.example" for rank in range(nnodes))
    spec = ClusterSpec("explicit", hosts, 0, nnodes, "sess")
    return MasterBook(spec, master_port=29500, epoch="e1")


def _member(book: MasterBook, rank: int) -> Member:
    return Member(rank, book.spec.hosts[rank], (f"10.0.{rank // 256}.{rank % 256}",), 2222)


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 1, 0, 2], [2, 2, 0, 3, 1]])
def test_missing_ranks_follow_joins(order: list[int]) -> None:
    book = _book(4)
    issued = []
    for rank in order:
        issued.append(book.record(_member(book, rank)))
        assert book.missing() == [r for r in range(4) if r not in book.members]
    assert issued[-1] is True and issued.count(True) == 1
    assert book.doc is not None and book.missing() == []


@pytest.mark.parametrize("nnodes", [2, 40])
def test_document_is_encoded_once_and_matches_the_codec(nnodes: int) -> None:
    book = _book(nnodes)
    for rank in range(nnodes):
        book.record(_member(book, rank))
    assert book.doc is not None
    encoded = book.encoded(book.doc)
    assert book.encoded(book.doc) is encoded
    assert encoded.body == cluster.encode_cluster_doc(book.doc)
    assert encoded.sha256 == hashlib.sha256(encoded.body).digest()
    if len(encoded.body) < GZIP_MIN_BYTES:
        assert encoded.gzipped is None
    else:
        assert encoded.gzipped is not None
        assert gzip.decompress(encoded.gzipped) == encoded.body
        assert len(encoded.gzipped) < len(encoded.body)
    assert cluster.parse_cluster_doc(encoded.body) == book.doc


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("", False),
        ("gzip", True),
        ("gzip, deflate", True),
        ("deflate, br", False),
        ("GZIP;q=0.5", True),
        ("identity, gzip; q=0.001", True),
        ("gzip;q=0", False),
        ("gzip; q=0.000", False),
        ("gzip;q=x", False),
        ("x-gzip", True),
        ("gzipped", False),
        ("*", False),
    ],
)
def test_accepts_gzip(header: str, expected: bool) -> None:
    assert cluster.accepts_gzip(header) is expected


_OCTETS = st.sampled_from(["0", "00", "7", "09", "10", "99", "100", "199", "249", "255", "256"])


@settings(max_examples=200)
@given(st.lists(_OCTETS, min_size=3, max_size=5).map(".".join) | st.text(max_size=20))
def test_address_fast_path_agrees_with_ipaddress(value: str) -> None:
    try:
        expected: str | None = str(ipaddress.ip_address(value))
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(PeerMessageError):
            fields.address(value)
    else:
        assert fields.address(value) == expected


@pytest.mark.parametrize("fmt", render.FORMATS)
def test_render_bytes_is_render_encoded(fmt: str) -> None:
    values = (("MASTER_ADDR", "node-0"), ("NOTE", "two words"), ("WORLD_SIZE", "4"))
    assert render.render_bytes(values, fmt) == render.render(dict(values), fmt).encode()
    assert render.render_bytes(values, fmt) is render.render_bytes(values, fmt)


def test_render_bytes_still_refuses_bad_values() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="NUL"):
            render.render_bytes((("K", "a\0b"),), "json")


def test_request_counter_is_the_labelled_child() -> None:
    metrics = Metrics()
    counter = metrics.request_counter("local", "/env", 200)
    assert metrics.request_counter("local", "/env", 200) is counter
    counter.inc()
    metrics.request_counter("local", "/env", 503).inc(2)
    sample = "rallypoint_http_requests_total"
    assert metrics.value(sample, api="local", route="/env", status="200") == 1
    assert metrics.value(sample, api="local", route="/env", status="503") == 2
