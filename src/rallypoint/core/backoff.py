"""Capped exponential backoff: the delay schedule, and a pause that a wake-up event cuts short."""

from __future__ import annotations

import contextlib
import random
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import asyncio

#: How a pause is drawn below its ceiling: "full" uniform(0, c) spreads nodes that started
#: together the most; "half" uniform(c/2, c) keeps a floor; "none" is c itself.
Jitter = Literal["full", "half", "none"]


class Backoff:
    """A ceiling that doubles from ``initial_s`` up to ``max_s`` per pause; ``reset`` restarts it.

    Only the schedule is kept here; each loop states its policy (jitter, wake-up event, the
    deadline it passes as ``cap_s``). Tests inject a seeded ``rng``.
    """

    def __init__(
        self,
        initial_s: float,
        max_s: float,
        *,
        jitter: Jitter = "full",
        rng: random.Random | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.jitter: Jitter = jitter
        self._rng = rng or random.Random()
        self._wake = wake
        self._attempt = 0

    def reset(self) -> None:
        """Start again from ``initial_s`` (after a success, or when woken)."""
        self._attempt = 0

    def next_s(self, cap_s: float | None = None) -> float:
        """The next pause in seconds, never above ``cap_s`` (time left before a deadline)."""
        # The exponent stops at 32 so a loop that runs for days cannot overflow the float.
        ceiling = min(self.max_s, self.initial_s * 2.0 ** min(self._attempt, 32))
        self._attempt += 1
        if cap_s is not None:
            ceiling = min(ceiling, max(cap_s, 0.0))
        if self.jitter == "full":
            return self._rng.uniform(0.0, ceiling)
        if self.jitter == "half":
            return self._rng.uniform(ceiling / 2, ceiling)
        return ceiling

    async def sleep(self, cap_s: float | None = None) -> bool:
        """Pause for the next delay; True when the wake event ended it (then it is cleared).

        A wake-up (a poke, an mDNS announcement) means the reason to wait is gone, so the
        schedule restarts from ``initial_s``.
        """
        # Imported here, not at the top: a coroutine finds asyncio loaded already, and the
        # blocking client (`rallypoint wait`) must not pay for it at start-up
        # (docs/performance.md).
        import asyncio

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
