"""What this node knows about each node of its session; the table is the only writer of it."""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Sequence, ValuesView

import msgspec

from rallypoint.core.names import Resolution
from rallypoint.model import ClusterSpec, Member


class PeerState(msgspec.Struct):
    """What this node knows about one node of the session (changed only through PeerTable)."""

    rank: int
    host: str
    joined: bool = False
    joined_after_s: float | None = None
    addresses: tuple[str, ...] = ()
    tf_port: int | None = None
    remote: str | None = None
    #: The relay whose batch carried its last join (None: it joined the master itself).
    relay: int | None = None
    in_scope: bool = False
    resolution: Resolution | None = None
    #: Why a resolution whose verdict is not OK is no problem here (names.why_acceptable), or None.
    excused: str | None = None


class PeerTable:
    """Every node of the spec by rank: the master's joins, the documents, the name checks."""

    def __init__(self, spec: ClusterSpec) -> None:
        self._peers = {rank: PeerState(rank, host) for rank, host in enumerate(spec.hosts)}

    def __getitem__(self, rank: int) -> PeerState:
        return self._peers[rank]

    def __len__(self) -> int:
        return len(self._peers)

    def values(self) -> ValuesView[PeerState]:
        return self._peers.values()

    def items(self) -> ItemsView[int, PeerState]:
        return self._peers.items()

    def joined(
        self, member: Member, remote: str | None, uptime_s: float, *, relay: int | None = None
    ) -> None:
        """The master recorded ``member``'s join from ``remote`` (None: the master itself),
        batched by the relay of rank ``relay`` (None: not batched)."""
        peer = self._peers[member.rank]
        if not peer.joined or peer.addresses != member.addresses:
            peer.joined_after_s = uptime_s
        peer.joined = True
        peer.addresses = member.addresses
        peer.tf_port = member.tf_port
        peer.remote = remote
        peer.relay = relay

    def listed(self, members: Iterable[Member]) -> None:
        """A cluster document lists ``members``: each joined with these facts."""
        for member in members:
            peer = self._peers[member.rank]
            peer.joined = True
            peer.addresses = member.addresses
            peer.tf_port = member.tf_port

    def scope(self, ranks: Sequence[int]) -> None:
        """Mark the ranks whose names this node verifies (and no others)."""
        wanted = set(ranks)
        for peer in self._peers.values():
            peer.in_scope = peer.rank in wanted

    def resolved(self, rank: int, res: Resolution, *, excused: str | None = None) -> None:
        """The latest resolution of ``rank``'s name here, and why it is fine if not OK."""
        peer = self._peers[rank]
        peer.resolution = res
        peer.excused = excused

    def in_scope(self) -> list[int]:
        """The ranks in scope of the last verification, in order."""
        return [rank for rank, peer in self._peers.items() if peer.in_scope]
