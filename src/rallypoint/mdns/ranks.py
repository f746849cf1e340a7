"""Rank assignment from mDNS announcements, purely: every node derives the same order."""

from __future__ import annotations

from collections.abc import Iterable

from rallypoint.errors import ClusterSpecError
from rallypoint.mdns.txt import Announcement


def assign_ranks(announcements: Iterable[Announcement], nnodes: int) -> tuple[str, ...] | None:
    """Hosts in node-rank order once exactly nnodes distinct hosts announced, else None.

    Every node applies the same rule to the same set, so all agree without talking:
    distinct host names sorted by code point; rank 0 (the master) is the first.
    More hosts than nnodes is refused with ClusterSpecError naming them, because any
    choice of which to leave out could differ between nodes.
    """
    if nnodes < 1:
        raise ClusterSpecError(f"RALLYPOINT_NNODES={nnodes} must be at least 1")
    items = list(announcements)
    sessions = sorted({a.session for a in items})
    if len(sessions) > 1:
        raise ClusterSpecError(f"assign_ranks got announcements of several sessions: {sessions}")
    hosts = sorted({a.host for a in items})
    if len(hosts) > nnodes:
        raise ClusterSpecError(
            f"mDNS sees {len(hosts)} hosts in session {sessions[0]!r} but RALLYPOINT_NNODES="
            f"{nnodes}: {','.join(hosts)}; stop the extra sidecars or use a distinct session"
        )
    if len(hosts) < nnodes:
        return None
    return tuple(hosts)
