"""Why a node is not ready: Reason values with stable codes; name reasons are in core/names.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import msgspec

from rallypoint.errors import AuthError
from rallypoint.model import Rank, at_most, matching

#: Longest message or detail a reason carries, in characters.
MAX_TEXT = 1000


class Reason(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why a node is not ready: a stable machine-readable code and a one-line remedy."""

    code: Annotated[str, matching(r"^[a-z_]{1,40}\Z", "a reason code: 1-40 of a-z and _")]
    message: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TEXT)]
    #: A host name or an IP literal (wire/fields.host_name checks it after decoding).
    host: str | None = None
    detail: Annotated[str, at_most(MAX_TEXT)] | None = None
    #: The ranks it is about: a node, or the two ends of a link.
    ranks: Annotated[tuple[Rank, ...], at_most(2)] = ()

    def as_json(self) -> dict[str, object]:
        """Its JSON object, as peers (msgspec, omit_defaults) and the APIs carry it."""
        out: dict[str, object] = {"code": self.code, "message": self.message}
        if self.host is not None:
            out["host"] = self.host
        if self.detail is not None:
            out["detail"] = self.detail
        if self.ranks:
            out["ranks"] = list(self.ranks)
        return out


def auth_reason(exc: AuthError) -> str:
    """A stable metric label for an authentication failure: the reason auth.py gave it."""
    return exc.reason


def discovering_reason(nnodes: int, seen: Sequence[str]) -> Reason:
    """Not ready because mDNS discovery has seen fewer than ``nnodes`` hosts of the session."""
    names = ", ".join(seen[:8]) + (f" and {len(seen) - 8} more" if len(seen) > 8 else "")
    return Reason(
        "discovering",
        f"mDNS discovery has seen {len(seen)} of {nnodes} nodes of the session"
        + (f" ({names})" if names else "")
        + "; start the others, or check that multicast reaches every node",
        detail=f"{len(seen)}/{nnodes}",
    )


#: Reason codes of failed connection probes, by the kind of port probed.
UNREACHABLE_CODES = {
    "master": "master_port_unreachable",
    "jax": "jax_port_unreachable",
    "probe": "peer_unreachable",
    "tf": "tf_port_unreachable",
}
_PORT_KINDS = {
    "master": "the master port",
    "jax": "the JAX coordinator port",
    "probe": "a port in its ephemeral range, where gloo and NCCL listen",
    "tf": "its TF worker port",
}
_CAUSE_REMEDIES = {
    "timeout": "a firewall, security group or route drops it: open the port between the nodes",
    "refused": "its sidecar does not answer there or a firewall rejects it: is the sidecar "
    "running, and the port open between the nodes?",
    "reset": "something resets the connection: check firewalls and proxies between the nodes",
    "no_route": "there is no route between the nodes: check the interfaces and routes",
    "foreign_answer": "something that is not this session's sidecar answers on that port "
    "(another process, a proxy, or a sidecar with another RALLYPOINT_TOKEN)",
    "wrong_peer": "the name leads to another node of the session: fix its DNS or /etc/hosts entry",
}


def path_mtu_reason(
    source: tuple[int, str], target: tuple[int, str, str], size: int, mtu: int | None
) -> Reason:
    """Not ready because full-size packets do not cross a pair's path: names the size that does.

    ``detail`` is the largest packet size (bytes, IP header included) that passed.
    """
    own_rank, own_host = source
    rank, host, address = target
    says = f"this node's interface says {mtu}" if mtu else "the interfaces say more"
    return Reason(
        "path_mtu",
        f"path MTU between {own_host} and {host} ({address}) is about {size} bytes, {says}: "
        "larger packets are dropped without a word (a path-MTU black hole), so the first "
        f"large all-reduce would hang; set the interface MTU to {size} on every node, or fix "
        "the network's MTU",
        host=host,
        detail=str(size),
        ranks=(own_rank, rank),
    )


def stalled_reason(
    source: tuple[int, str], target: tuple[int, str, str], port: int, detail: str
) -> Reason:
    """Not ready because data stopped on a pair whose handshake and answer passed, at any size."""
    own_rank, own_host = source
    rank, host, address = target
    return Reason(
        "data_stalled",
        f"{own_host} reached {host} ({address}) on tcp/{port} and its sidecar answered, but "
        f"{detail}, even in small packets: something between the nodes lets connections "
        "open and then stops their data; check firewalls, proxies and traffic policers",
        host=host,
        detail="stalled",
        ranks=(own_rank, rank),
    )


def slow_link_failure(
    source: tuple[int, str], target: tuple[int, str], mbps: float, floor: float
) -> Reason:
    """Not ready because a measured link is below --min-link-mbps."""
    own_rank, own_host = source
    rank, host = target
    return Reason(
        "slow_link",
        f"the link between {own_host} and {host} carries {mbps:,.1f} Mbit/s, below "
        f"--min-link-mbps {floor:g}: check the NICs, cables, switch ports and routes between "
        "them, or lower the floor",
        host=host,
        detail="floor",
        ranks=(own_rank, rank),
    )


def unreachable_reason(
    source: tuple[int, str],
    target: tuple[int, str, str],
    kind: str,
    port: int,
    cause: str,
    detail: str,
) -> Reason:
    """Not ready because a connection the job will make failed: names the pair and the port.

    ``detail`` of the Reason is the stable cause (timeout, refused, reset, no_route,
    foreign_answer, wrong_peer, error); the message carries the probe's own words.
    """
    own_rank, own_host = source
    rank, host, address = target
    remedy = _CAUSE_REMEDIES.get(cause, "check the network between the nodes")
    return Reason(
        UNREACHABLE_CODES[kind],
        f"{own_host} cannot reach {host} ({address}) on tcp/{port}, {_PORT_KINDS[kind]}: "
        f"{detail}; {remedy}",
        host=host,
        detail=cause,
        ranks=(own_rank, rank),
    )
