"""Free ports for tests (plumbing only: production holds the ports it hands out)."""

from __future__ import annotations

import random
import socket

#: Where free_port looks by default: below Linux's ephemeral range (32768-60999), where the
#: outgoing connections of the nodes a test already started cannot take a port handed out
#: for a node it starts later, and above the sidecar's own port range (20000-29999).
DEFAULT_RANGE = (30000, 32700)


def free_port(host: str = "127.0.0.1", *, low: int = 0, high: int = 0) -> int:
    """A port nothing is bound to on ``host`` right now, in [low, high] (default DEFAULT_RANGE)."""
    if not high:
        low, high = DEFAULT_RANGE
    for _attempt in range(200):
        port = random.randint(low, high)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            found: int = sock.getsockname()[1]
            return found
    raise AssertionError(f"no free port in {low}-{high}")
