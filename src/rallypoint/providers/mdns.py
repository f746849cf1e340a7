"""The mdns provider: no host list at all; nodes find each other on the LAN by mDNS.

This module only reads and validates the environment. Discovery itself (python-zeroconf)
lives in rallypoint.mdns; until it completes the spec has no hosts and no rank.
"""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers._common import MAX_NODES, choose_session, get, parse_int, require, show

NAME = "mdns"
DISCOVERY = "RALLYPOINT_DISCOVERY"
NNODES = "RALLYPOINT_NNODES"
#: Session used when RALLYPOINT_SESSION is unset; two such clusters on one LAN would merge.
DEFAULT_SESSION = "rallypoint"


def detects(environ: Mapping[str, str]) -> bool:
    """True when RALLYPOINT_DISCOVERY is mdns and RALLYPOINT_NNODES is set."""
    discovery = get(environ, DISCOVERY)
    return (
        discovery is not None and discovery.lower() == "mdns" and get(environ, NNODES) is not None
    )


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """An empty spec of RALLYPOINT_NNODES nodes (hosts=(), rank=-1) for discovery to fill in."""
    discovery = get(environ, DISCOVERY)
    if discovery is not None and discovery.lower() != "mdns":
        raise ClusterSpecError(
            f"{DISCOVERY}={show(discovery)} is not a known discovery; the only one is 'mdns'"
        )
    nnodes = parse_int(
        NNODES,
        require(environ, NNODES, "mDNS discovery waits for that many nodes; set it"),
        minimum=1,
        maximum=MAX_NODES,
    )
    return ClusterSpec(
        provider=NAME,
        hosts=(),
        rank=-1,
        nnodes=nnodes,
        session=choose_session(environ, DEFAULT_SESSION),
        facts=(("discovery", "mdns"),),
    )
