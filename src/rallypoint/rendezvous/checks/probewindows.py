"""Listening windows: peers' connection probes are answered on this node's held ports.

Until the node turns ready, the ports the job will listen on (the master port, the JAX
coordinator's, the TF worker's and the probe port) answer probes, so a peer's connection
check reaches the very port the job's connection will (rendezvous/checks/connectivity.py); before
ready they close again, so the job's own listeners find them free to bind.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rallypoint.errors import PortError
from rallypoint.net import probe
from rallypoint.net.ports import HeldPort

log = logging.getLogger("rallypoint.rendezvous")

#: Window kinds, by the name of the held port they open on.
WINDOW_KINDS = ("master", "jax", "tf", "probe")


class Windows:
    """Listening windows on this node's held ports, all answered by one probe listener.

    A window that cannot open because something already listens on the port (the job's
    own TCPStore or TF server, after a generation change) is *busy*: peers then see a
    foreign answer there, which the master excuses for that port (ClusterVerdict.excused).
    Once the job lets the port go (it was stopped), the window opens after all
    (reopen_busy): until then the peers' probes there are refused and retried.
    """

    def __init__(self, held: Mapping[str, HeldPort], listener: probe.ProbeListener) -> None:
        self.held = held
        self.listener = listener
        self.busy: frozenset[str] = frozenset()
        self.state: dict[str, str] = {kind: "closed" for kind in held if kind in WINDOW_KINDS}
        self._open = False

    async def open(self) -> None:
        """Open every window that is not open yet; idempotent."""
        if self._open:
            return
        self._open = True
        kinds = [kind for kind in self.held if kind in WINDOW_KINDS]
        self.busy = frozenset([kind for kind in kinds if not await self._listen(kind)])

    async def reopen_busy(self) -> None:
        """Open the busy windows whose port is free now (the job that held it ended)."""
        if self._open and self.busy:
            self.busy = frozenset([kind for kind in self.busy if not await self._listen(kind)])

    async def _listen(self, kind: str) -> bool:
        """Open ``kind``'s window; False when the port is busy."""
        held = self.held[kind]
        try:
            sockets = held.listen()
        except PortError as exc:
            if self.state[kind] != "busy":
                log.info("window_busy", extra={"kind": kind, "port": held.port, "error": str(exc)})
            self.state[kind] = "busy"
            return False
        if self.state[kind] == "busy":
            log.info("window_reopened", extra={"kind": kind, "port": held.port})
        await self.listener.serve(sockets)
        self.state[kind] = "open"
        return True

    async def close(self) -> None:
        """Close every window (the holds stay); idempotent."""
        if not self._open:
            return
        self._open = False
        await self.listener.close()
        self.state = dict.fromkeys(self.state, "closed")
        self.busy = frozenset()
