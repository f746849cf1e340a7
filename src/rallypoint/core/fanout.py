"""Pure: the fan-out tree over rank order, i.e. which rank relays for which (docs/scale.md).

Ranks are cut into groups of ``size`` consecutive ranks; the first rank of each group is
its relay. Group 0's relay is the master itself, so its ranks join the master directly. Every
node computes the same tree from the spec alone: no message is needed to learn one's relay.
"""

from __future__ import annotations

import math

#: Below this many nodes every worker joins the master directly (one hop is faster, and
#: the master handles that many requests easily: docs/performance.md section 2).
AUTO_MIN_NODES = 512
#: The largest group: a relay's batch of this many joins fits the peer API's body limit.
MAX_GROUP = 128


def group_size(nnodes: int, setting: int | None) -> int:
    """The group size for ``nnodes`` nodes; 0 means no tree (``setting`` None = automatic)."""
    if setting is None:
        if nnodes < AUTO_MIN_NODES:
            return 0
        # sqrt(N) balances the master's load (N / size relays) and each relay's (size).
        return min(MAX_GROUP, math.isqrt(nnodes - 1) + 1)
    if setting < 2 or setting >= nnodes:
        return 0
    return min(MAX_GROUP, setting)


def relay_of(rank: int, size: int) -> int | None:
    """The rank that relays for ``rank``; None when it talks to the master directly."""
    if size == 0 or rank < size:
        return None
    first = rank - rank % size
    return None if first == rank else first


def group(relay: int, size: int, nnodes: int) -> range:
    """The ranks a relay serves (itself excluded); empty when ``relay`` is not a relay."""
    if size == 0 or relay == 0 or relay % size:
        return range(0)
    return range(relay + 1, min(relay + size, nnodes))


def relays(size: int, nnodes: int) -> range:
    """Every relay's rank, the master's group excluded."""
    return range(size, nnodes, size) if size else range(0)
