"""Pure codec of the cluster document (GET /v1/cluster): every member of one generation.

Its members are the same JSON objects a join carries (a Member's fields, checked by
wire.checked_member); the parser also checks the document as a whole: ranks 0..N-1 in
order, unique hosts, and the master as rank 0. A large document travels gzipped to the
askers that accept it.
"""

from __future__ import annotations

import msgspec

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterDoc
from rallypoint.wire.fields import dump, host_name, load

#: Largest cluster document accepted: about 4096 nodes with a few addresses each.
MAX_DOC_BYTES = 8 * 1024 * 1024


def encode_cluster_doc(doc: ClusterDoc) -> bytes:
    """The JSON body of GET /v1/cluster."""
    return dump(doc)


def parse_cluster_doc(body: bytes) -> ClusterDoc:
    """Validate a cluster document: ranks 0..N-1 in order, unique hosts, master is rank 0."""
    doc = load(body, ClusterDoc, MAX_DOC_BYTES, "cluster document")
    members = []
    for index, member in enumerate(doc.members):
        if member.rank != index:
            raise PeerMessageError(
                f"cluster document: members[{index}] has rank {member.rank}, expected {index}"
            )
        members.append(wire.checked_member(member, f"cluster document: members[{index}]"))
    hosts = {m.host.lower() for m in members}
    if len(hosts) != len(members):
        raise PeerMessageError("cluster document: a host appears twice in members")
    master_host = host_name(doc.master_host, "cluster document: master_host")
    if master_host != members[0].host:
        raise PeerMessageError(
            f"cluster document: master_host {master_host!r} is not members[0].host "
            f"{members[0].host!r}"
        )
    return msgspec.structs.replace(doc, master_host=master_host, members=tuple(members))


def accepts_gzip(accept_encoding: str) -> bool:
    """Whether an Accept-Encoding header value names gzip without refusing it (q=0)."""
    for item in accept_encoding.split(","):
        coding, _, params = item.partition(";")
        if coding.strip().lower() not in ("gzip", "x-gzip"):
            continue
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False
