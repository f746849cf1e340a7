"""A backoff's pause on the event loop: core/backoff.py's schedule, cut short by a wake-up."""

from __future__ import annotations

import asyncio
import contextlib
import random

from rallypoint.core.backoff import Backoff, Jitter


class Pause(Backoff):
    """Backoff whose ``sleep`` waits on the loop; a set ``wake`` event ends the pause early."""

    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        jitter: Jitter = "full",
        rng: random.Random | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        super().__init__(initial_s, max_s, jitter=jitter, rng=rng)
        self._wake = wake

    async def sleep(self, cap_s: float | None = None) -> bool:
        """Pause for the next delay; True when the wake event ended it (then it is cleared).

        A wake-up (a poke, an mDNS announcement) means the reason to wait is gone, so the
        schedule restarts from ``initial_s``.
        """
        wake = self._wake
        if wake is None:
            await asyncio.sleep(self.next_s(cap_s))
            return False
        if not wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.next_s(cap_s))
        woke = wake.is_set()
        wake.clear()
        if woke:
            self.reset()
        return woke
