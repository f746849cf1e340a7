"""A fast `Settings`: loopback listeners, small timings, no mDNS unless a test asks."""

from __future__ import annotations

from typing import Any

from msgspec.structs import replace

from rallypoint.settings import Settings


def fast_settings(**changes: Any) -> Settings:
    """Settings for in-process nodes: every wait short, every listener on 127.0.0.1."""
    settings = Settings(
        local_hosts=("127.0.0.1",),
        peer_host="127.0.0.1",
        deadline_s=20.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.2,
        long_poll_s=2.0,
        resolve_timeout_s=1.0,
        shutdown_grace_s=2.0,
        mdns=False,
    )
    return replace(settings, **changes)
