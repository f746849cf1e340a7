"""EncodedDoc: one encoding per document, reused only for the document it encodes."""

from __future__ import annotations

import gzip
import hashlib

from rallypoint.model import ClusterDoc, Member
from rallypoint.rendezvous.cluster.masterbook import GZIP_MIN_BYTES, EncodedDoc
from rallypoint.wire import cluster


def doc(generation: str, nnodes: int = 2) -> ClusterDoc:
    members = tuple(Member(rank, f"node{rank}", (f"10.0.0.{rank + 1}",)) for rank in range(nnodes))
    return ClusterDoc("s", generation, "node0", 29500, members)


def test_an_encoding_is_the_documents_json_its_digest_and_gzip_when_large() -> None:
    small, large = doc("e.1"), doc("e.2", nnodes=64)
    for d in (small, large):
        encoded = EncodedDoc.of(d)
        assert encoded.body == cluster.encode_cluster_doc(d)
        assert encoded.sha256 == hashlib.sha256(encoded.body).digest()
    assert len(EncodedDoc.of(small).body) < GZIP_MIN_BYTES
    assert EncodedDoc.of(small).gzipped is None
    packed = EncodedDoc.of(large).gzipped
    assert packed is not None and gzip.decompress(packed) == EncodedDoc.of(large).body


def test_the_current_documents_encoding_is_reused() -> None:
    current = doc("e.1")
    cached = EncodedDoc.of(current)
    assert EncodedDoc.reusing(current, current, cached) is cached


def test_any_other_document_is_encoded_afresh() -> None:
    current, older = doc("e.2"), doc("e.1")
    cached = EncodedDoc.of(current)
    # An equal document that is not the current object is still encoded from itself.
    for other in (older, doc("e.2")):
        encoded = EncodedDoc.reusing(other, current, cached)
        assert encoded is not cached and encoded == EncodedDoc.of(other)
    assert EncodedDoc.reusing(current, current, None) == cached
    assert EncodedDoc.reusing(current, None, None) == cached
