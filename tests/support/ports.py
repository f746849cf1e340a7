"""Free ports for tests (plumbing only: production holds the ports it hands out)."""

from __future__ import annotations

import random
import socket


def free_port(host: str = "127.0.0.1", *, low: int = 0, high: int = 0) -> int:
    """A port nothing is bound to on ``host`` right now; in [low, high] when high is given."""
    for _attempt in range(200):
        port = random.randint(low, high) if high else 0
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                if not high:
                    raise
                continue
            found: int = sock.getsockname()[1]
            return found
    raise AssertionError(f"no free port in {low}-{high}")
