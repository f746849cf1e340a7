"""The single provider: one node, master on loopback, so a laptop needs no configuration."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers._common import MAX_NODES, choose_session, get, get_int, show

NAME = "single"
#: The literal address rather than "localhost": that name may resolve to ::1 first while a
#: training stack listens on IPv4 only.
HOST = "127.0.0.1"
SESSION = "single"


def detects(environ: Mapping[str, str]) -> bool:
    """Always True: the fallback when no other provider recognises the environment."""
    return True


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """One node at 127.0.0.1; refuses settings that announce a larger cluster."""
    nnodes = get_int(environ, "RALLYPOINT_NNODES", minimum=1, maximum=MAX_NODES)
    discovery = get(environ, "RALLYPOINT_DISCOVERY")
    if discovery is not None and discovery.lower() != "mdns":
        raise ClusterSpecError(
            f"RALLYPOINT_DISCOVERY={show(discovery)} is not a known discovery; the only one"
            " is 'mdns'"
        )
    if discovery is not None and nnodes is None:
        raise ClusterSpecError(
            "RALLYPOINT_DISCOVERY=mdns needs RALLYPOINT_NNODES; set it to the number of nodes"
        )
    if nnodes is not None and nnodes > 1:
        raise ClusterSpecError(
            f"RALLYPOINT_NNODES={nnodes} but no cluster provider matched; set RALLYPOINT_HOSTS"
            " (or RALLYPOINT_DISCOVERY=mdns), or choose a provider"
        )
    return ClusterSpec(
        provider=NAME,
        hosts=(HOST,),
        rank=0,
        nnodes=1,
        session=choose_session(environ, SESSION),
        loopback_ok=True,
        facts=(),
    )
