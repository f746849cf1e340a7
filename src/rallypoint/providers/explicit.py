"""The explicit provider: the operator lists the nodes in RALLYPOINT_HOSTS."""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.errors import ClusterSpecError
from rallypoint.model import ClusterSpec
from rallypoint.providers._common import (
    build,
    check_nnodes,
    detected_by,
    find_host,
    get,
    get_int,
    host_name,
    hosts_session,
    ip_literal,
    require,
    show,
    split_list,
    unique,
)

NAME = "explicit"
HOSTS = "RALLYPOINT_HOSTS"
NODE_RANK = "RALLYPOINT_NODE_RANK"
MASTER = "RALLYPOINT_MASTER"


#: True when RALLYPOINT_HOSTS is set and not blank.
detects = detected_by(HOSTS)


def read(environ: Mapping[str, str]) -> ClusterSpec:
    """Nodes from RALLYPOINT_HOSTS; the master (RALLYPOINT_MASTER, default the first) at rank 0.

    RALLYPOINT_NODE_RANK is this node's 0-based position in RALLYPOINT_HOSTS as written
    (or HOSTNAME is looked up there). Served ranks put the master first and keep the other
    hosts in list order, so they equal the positions whenever the master is listed first.
    """
    raw = require(environ, HOSTS, "list every node's host name or address, separated by commas")
    listed = [host_name(HOSTS, entry, allow_ip=True) for entry in split_list(HOSTS, raw)]
    unique(HOSTS, listed)
    check_nnodes(environ, "RALLYPOINT_NNODES", len(listed), HOSTS)

    master_position = 0
    master = get(environ, MASTER)
    if master is not None:
        wanted = (ip_literal(master) or master).lower()
        matches = [i for i, host in enumerate(listed) if host.lower() == wanted]
        if not matches:
            raise ClusterSpecError(
                f"{MASTER}={show(master)} is not one of {HOSTS}; name one of the listed hosts"
            )
        master_position = matches[0]

    position = get_int(environ, NODE_RANK, minimum=0, maximum=len(listed) - 1)
    if position is None:
        hostname = get(environ, "HOSTNAME")
        if hostname is None:
            raise ClusterSpecError(
                f"cannot tell which node of {HOSTS} this is; set {NODE_RANK} to this node's"
                f" 0-based position in {HOSTS}"
            )
        position = find_host(listed, hostname)
        if position is None:
            raise ClusterSpecError(
                f"HOSTNAME={show(hostname)} is not (uniquely) one of {HOSTS}; set {NODE_RANK}"
                f" to this node's 0-based position in {HOSTS}"
            )

    order = [master_position, *(i for i in range(len(listed)) if i != master_position)]
    hosts = [listed[i] for i in order]
    return build(
        NAME,
        hosts,
        order.index(position),
        hosts_session(environ, NAME, hosts),
        facts=(("position", str(position)), ("master_position", str(master_position))),
    )
