"""The master's join book: checks and records joins, issues cluster documents, serves long-polls."""

from __future__ import annotations

import asyncio

from rallypoint import wire
from rallypoint.errors import PeerMessageError
from rallypoint.model import ClusterDoc, ClusterSpec, Member


class JoinRejected(PeerMessageError):
    """Raised when a peer request is well-formed but refused (wrong session, impostor ...)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class MasterBook:
    """The master's record of joined nodes and the cluster document derived from it."""

    def __init__(self, spec: ClusterSpec, master_port: int, epoch: str) -> None:
        self.spec = spec
        self.master_port = master_port
        self.epoch = epoch
        self.members: dict[int, Member] = {}
        self.doc: ClusterDoc | None = None
        self._counter = 0
        self._changed = asyncio.Event()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """End every long-poll now (they answer "nothing new"): the master is going away."""
        self._closed = True
        self._changed.set()

    def missing(self) -> list[int]:
        return [r for r in range(self.spec.nnodes) if r not in self.members]

    def check(self, request: wire.JoinRequest) -> None:
        """Refuse joins from another session, outside the spec, or from the wrong host."""
        spec, member = self.spec, request.member
        if request.session != spec.session:
            raise JoinRejected(
                409,
                "session_mismatch",
                f"join for session {request.session!r}, but this master serves "
                f"{spec.session!r}; give every node the same session",
            )
        if not 0 < member.rank < spec.nnodes:
            raise JoinRejected(
                400,
                "rank_out_of_range",
                f"rank {member.rank} cannot join: worker ranks are 1-{spec.nnodes - 1}",
            )
        expected = spec.hosts[member.rank]
        if member.host.lower() != expected.lower():
            raise JoinRejected(
                403,
                "impostor",
                f"host {member.host!r} claims rank {member.rank}, which the spec gives to "
                f"{expected!r}; check the node list and the node's own rank",
            )

    def record(self, member: Member) -> bool:
        """Store a join; True when it produced a new cluster document."""
        self.members[member.rank] = member
        if self.missing():
            return False
        members = tuple(self.members[r] for r in range(self.spec.nnodes))
        if self.doc is not None and self.doc.members == members:
            return False
        self._counter += 1
        self.doc = ClusterDoc(
            session=self.spec.session,
            generation=f"{self.epoch}.{self._counter}",
            master_host=self.spec.master,
            master_port=self.master_port,
            members=members,
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return True

    async def wait(self, after: str | None, timeout_s: float) -> ClusterDoc | None:
        """A document whose generation is not ``after``, or None after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout_s
        while self.doc is None or self.doc.generation == after:
            remaining = end - loop.time()
            if remaining <= 0 or self._closed:
                return None
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return None
        return self.doc
