"""Pure codec of the cluster document (GET /v1/cluster): every member of one generation.

Its members are the same JSON objects a join carries (a Member's fields; wire.member_from);
the parser also checks the document as a whole: ranks 0..N-1 in order, unique hosts, and the
master as rank 0. A large document travels gzipped to the askers that accept it.
"""

from __future__ import annotations

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterDoc, Member
from rallypoint.wire.fields import MAX_NODES, dump, generation, host_name, integer, load, session

#: Largest cluster document accepted: about 4096 nodes with a few addresses each.
MAX_DOC_BYTES = 8 * 1024 * 1024


def encode_cluster_doc(doc: ClusterDoc) -> bytes:
    """The JSON body of GET /v1/cluster."""
    return dump(doc)


def parse_cluster_doc(body: bytes) -> ClusterDoc:
    """Validate a cluster document: ranks 0..N-1 in order, unique hosts, master is rank 0."""
    data = load(body, MAX_DOC_BYTES, "cluster document")
    raw_members = data.get("members")
    if not isinstance(raw_members, list) or not 1 <= len(raw_members) <= MAX_NODES:
        raise PeerMessageError(f"cluster document: members must be a list of 1-{MAX_NODES} nodes")
    members: list[Member] = []
    for index, raw in enumerate(raw_members):
        if not isinstance(raw, dict):
            raise PeerMessageError(f"cluster document: members[{index}] is not an object")
        member = wire.member_from(raw, f"members[{index}]")
        if member.rank != index:
            raise PeerMessageError(
                f"cluster document: members[{index}] has rank {member.rank}, expected {index}"
            )
        members.append(member)
    hosts = [m.host.lower() for m in members]
    if len(set(hosts)) != len(hosts):
        raise PeerMessageError("cluster document: a host appears twice in members")
    master_host = host_name(data.get("master_host"), "master_host")
    if master_host != members[0].host:
        raise PeerMessageError(
            f"cluster document: master_host {master_host!r} is not members[0].host "
            f"{members[0].host!r}"
        )
    return ClusterDoc(
        session=session(data.get("session"), "session"),
        generation=generation(data.get("generation"), "generation"),
        master_host=master_host,
        master_port=integer(data.get("master_port"), "master_port", 1, 65535),
        members=tuple(members),
    )


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
