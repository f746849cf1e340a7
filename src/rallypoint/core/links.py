"""Pure: which links each node measures, and what the cluster's measurements say.

Every probed pair moves full-size segments both ways (the path check, net/probe.py); a few
links per node also move enough data to measure throughput. The measured links are a ring
over rank order plus a second ring with a stride of about sqrt(N) (all pairs up to
ALL_PAIRS_MAX nodes): 2N links at most, so the cost grows linearly with N, and every node
is an end of at least four links (two up to ALL_PAIRS_MAX), so a bad node shows as a node
whose every link is bad while a bad link shows alone (docs/readiness.md, "Data path").
A link's wire form is its fields: msgspec writes them and reads them back within the bounds
declared here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, NamedTuple

import msgspec

from rallypoint.model import Rank, within
from rallypoint.reasons import Reason

#: Largest rate accepted from a peer, Mbit/s (10 Tbit/s).
MAX_MBPS = 1e7
#: Longest round trip accepted, ms (an hour).
MAX_RTT_MS = 3.6e6
Mbps = Annotated[float, within(0.0, MAX_MBPS)]
Share = Annotated[float, within(0.0, 1.0)]

#: Up to this many nodes every pair's throughput is measured (N(N-1)/2 links).
ALL_PAIRS_MAX = 8
#: A leg of a link below this share of the best leg of its kind is slow: ten times slower.
#: Measured on two cores, clean clusters spread up to ~5x (docs/performance.md).
SLOW_SHARE = 0.1
#: A direction of a link that retransmits more than this share of its bytes is lossy.
LOSSY_SHARE = 0.03


class LinkStat(msgspec.Struct, frozen=True):
    """One link as the node at its first end measured it: up is towards ``peer``."""

    peer: Rank
    up_mbps: Mbps
    down_mbps: Mbps
    #: Shares of the bytes sent that were retransmitted, each way (None: not known).
    up_retrans: Share | None = None
    down_retrans: Share | None = None
    rtt_ms: Annotated[float, within(0.0, MAX_RTT_MS)] | None = None
    #: Bytes moved each way; less than asked when the transfer ran out of time.
    bytes: Annotated[int, within(0, 1 << 40)] = 0
    complete: bool = True

    def rounded(self) -> LinkStat:
        """This link at the precision its wire form carries: kbit/s, 1e-5 of a share, us."""
        return msgspec.structs.replace(
            self,
            up_mbps=round(self.up_mbps, 3),
            down_mbps=round(self.down_mbps, 3),
            up_retrans=_round(self.up_retrans, 5),
            down_retrans=_round(self.down_retrans, 5),
            rtt_ms=_round(self.rtt_ms, 3),
        )


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def stride(nnodes: int) -> int:
    """The second ring's stride: about sqrt(N), at least 2 and below N/2."""
    return max(2, math.isqrt(nnodes))


def measured_peers(nnodes: int, rank: int) -> list[int]:
    """The ranks whose link with ``rank`` this node measures (it is the link's first end)."""
    if nnodes <= ALL_PAIRS_MAX:
        return list(range(rank + 1, nnodes))
    peers = [(rank + 1) % nnodes]
    second = (rank + stride(nnodes)) % nnodes
    if second not in peers:
        peers.append(second)
    return peers


def judge(
    measured: Mapping[int, Sequence[LinkStat]],
    hosts: Sequence[str],
    *,
    slow_share: float = SLOW_SHARE,
    lossy_share: float = LOSSY_SHARE,
) -> list[Reason]:
    """Warnings (codes slow_link and lossy_link) about the links ``measured`` by each rank.

    A direction is slow below ``slow_share`` of the best measured anywhere in the cluster
    the same way (up legs against up legs, down legs against down legs: the two legs are
    received by different code, and the comparison should see only the network), lossy
    above ``lossy_share`` retransmitted. Where every link of one node (two
    at least) is slow, or lossy, the warning names the node instead of each of its links.
    """
    links = [
        (rank, link)
        for rank, stats in sorted(measured.items())
        for link in stats
        if 0 <= rank < len(hosts) and 0 <= link.peer < len(hosts) and link.peer != rank
    ]
    best_up = max((link.up_mbps for _, link in links), default=0.0)
    best_down = max((link.down_mbps for _, link in links), default=0.0)
    slow: list[_Bad] = []
    lossy: list[_Bad] = []
    for rank, link in links:
        for src, dst, mbps, top, retrans in (
            (rank, link.peer, link.up_mbps, best_up, link.up_retrans),
            (link.peer, rank, link.down_mbps, best_down, link.down_retrans),
        ):
            if top > 0 and mbps < top * slow_share:
                slow.append(_Bad(src, dst, mbps, link, top))
            if retrans is not None and retrans > lossy_share:
                lossy.append(_Bad(src, dst, retrans, link, top))
    degree: dict[int, int] = {}  # rank -> how many distinct measured links it is an end of
    for a, b in {(min(rank, link.peer), max(rank, link.peer)) for rank, link in links}:
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    return _warn(slow, degree, hosts, "slow_link") + _warn(lossy, degree, hosts, "lossy_link")


class _Bad(NamedTuple):
    """One bad leg: from, to, its figure (Mbit/s or retransmitted share), the link, and the
    best leg of its kind it was judged against."""

    src: int
    dst: int
    figure: float
    link: LinkStat
    best: float

    @property
    def pair(self) -> tuple[int, int]:
        return (min(self.src, self.dst), max(self.src, self.dst))


def _warn(
    bad: list[_Bad], degree: Mapping[int, int], hosts: Sequence[str], code: str
) -> list[Reason]:
    """One warning per bad node (every link of it bad), then one per remaining bad link."""
    links_of: dict[int, set[tuple[int, int]]] = {}
    for leg in bad:
        for end in leg.pair:
            links_of.setdefault(end, set()).add(leg.pair)
    nodes = sorted(n for n, pairs in links_of.items() if len(pairs) >= degree.get(n, 0) >= 2)
    out: list[Reason] = []
    covered: set[tuple[int, int]] = set()
    for node in nodes:
        covered |= links_of[node]
        legs = [leg for leg in bad if node in (leg.src, leg.dst)]
        out.append(_node_reason(code, node, hosts, legs))
    seen: set[tuple[int, int]] = set()
    for leg in bad:
        if leg.pair in covered or (leg.src, leg.dst) in seen:
            continue
        seen.add((leg.src, leg.dst))
        out.append(_link_reason(code, leg, hosts))
    return out


def _node_reason(code: str, node: int, hosts: Sequence[str], legs: list[_Bad]) -> Reason:
    host = hosts[node]
    figures = [leg.figure for leg in legs]
    if code == "slow_link":
        best = max(leg.best for leg in legs)
        span = _span([f"{f:,.1f}" for f in (min(figures), max(figures))], " Mbit/s")
        message = (
            f"every measured link of {host} is slow ({span} against the cluster's best "
            f"{best:,.0f} Mbit/s): the job will run at {host}'s speed; check its NIC, cable, "
            "switch port and any shaping or policing on its link"
        )
    else:
        span = _span([f"{f:.1%}" for f in (min(figures), max(figures))], "")
        message = (
            f"every measured link of {host} retransmits ({span} of the data): packets to or "
            f"from {host} are lost; check its NIC, cable, switch port and drop counters"
        )
    return Reason(code, message, host=host, detail="node", ranks=(node,))


def _link_reason(code: str, leg: _Bad, hosts: Sequence[str]) -> Reason:
    rtt = "" if leg.link.rtt_ms is None else f", RTT {_ms(leg.link.rtt_ms)}"
    a, b = hosts[leg.src], hosts[leg.dst]
    if code == "slow_link":
        message = (
            f"the link {a} -> {b} carries {leg.figure:,.1f} Mbit/s, the cluster's best links "
            f"{leg.best:,.0f} Mbit/s{rtt}: the job will run at the speed of its slowest link; "
            f"check the NICs, cables, switch ports and routes between {a} and {b}"
        )
    else:
        message = (
            f"{leg.figure:.1%} of the data {a} sent {b} was retransmitted{rtt}: packets are "
            f"lost between them; check the NICs, cables and switch ports between {a} and {b}"
        )
    return Reason(code, message, host=b, detail="link", ranks=(leg.src, leg.dst))


def _ms(value: float) -> str:
    """A round trip as people read it: 0.12 ms, or 4 us below a hundredth of a millisecond."""
    return f"{value:.2f} ms" if value >= 0.01 else f"{value * 1000:.0f} us"


def _span(values: list[str], unit: str) -> str:
    low, high = values
    return f"{low}{unit}" if low == high else f"{low}-{high}{unit}"
