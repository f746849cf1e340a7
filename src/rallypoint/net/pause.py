"""A backoff's pause on the event loop: core/backoff.py's schedule, cut short by a wake-up."""

from __future__ import annotations

import asyncio
import contextlib

from rallypoint.core.backoff import Backoff


class Pause:
    """A pause on the loop for each of ``schedule``'s delays; a set ``wake`` event ends one
    early."""

    def __init__(self, schedule: Backoff, wake: asyncio.Event | None = None) -> None:
        self.schedule = schedule
        self._wake = wake

    def reset(self) -> None:
        """Start the schedule again (after a success)."""
        self.schedule.reset()

    async def sleep(self, cap_s: float | None = None) -> bool:
        """Pause for the next delay; True when the wake event ended it (then it is cleared).

        A wake-up (a poke, an mDNS announcement) means the reason to wait is gone, so the
        schedule restarts from its first delay.
        """
        wake = self._wake
        if wake is None:
            await asyncio.sleep(self.schedule.next_s(cap_s))
            return False
        if not wake.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.schedule.next_s(cap_s))
        woke = wake.is_set()
        wake.clear()
        if woke:
            self.schedule.reset()
        return woke
