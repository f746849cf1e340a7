"""Pure: a measured link's wire form, as reports, /status and the master's views carry it.

The link and what its measurements say are core/links.py's; its JSON object is its fields
(msgspec writes them, LinkStat.rounded keeps them at wire precision), read back here, within
limits, by ``links_from``.
"""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.core.links import LinkStat
from rallypoint.errors import PeerMessageError
from rallypoint.wire.fields import MAX_NODES, boolean, integer, number

#: Links one report may carry (a node measures at most links.ALL_PAIRS_MAX - 1, or 2).
MAX_LINKS = 64
#: Largest rate accepted from a peer, Mbit/s (10 Tbit/s).
MAX_MBPS = 1e7
#: Longest round trip accepted, ms (an hour).
MAX_RTT_MS = 3.6e6


def links_from(data: object, where: str) -> tuple[LinkStat, ...]:
    """Measured links from a peer's JSON list; PeerMessageError names the field at fault."""
    if not isinstance(data, list) or len(data) > MAX_LINKS:
        raise PeerMessageError(f"{where}: links must be a list of at most {MAX_LINKS}")
    out = []
    for index, item in enumerate(data):
        at = f"{where}: links[{index}]"
        if not isinstance(item, dict):
            raise PeerMessageError(f"{at} is not an object")
        out.append(
            LinkStat(
                peer=integer(item.get("peer"), f"{at}.peer", 0, MAX_NODES - 1),
                up_mbps=number(item.get("up_mbps"), f"{at}.up_mbps", 0.0, MAX_MBPS),
                down_mbps=number(item.get("down_mbps"), f"{at}.down_mbps", 0.0, MAX_MBPS),
                up_retrans=_optional_number(item, "up_retrans", at, 1.0),
                down_retrans=_optional_number(item, "down_retrans", at, 1.0),
                rtt_ms=_optional_number(item, "rtt_ms", at, MAX_RTT_MS),
                bytes=integer(item.get("bytes", 0), f"{at}.bytes", 0, 1 << 40),
                complete=boolean(item.get("complete", True), f"{at}.complete"),
            )
        )
    return tuple(out)


def _optional_number(item: Mapping[str, object], key: str, at: str, high: float) -> float | None:
    """``item[key]``: absent or null, else a number in 0..high."""
    value = item.get(key)
    return None if value is None else number(value, f"{at}.{key}", 0.0, high)
