"""Capped exponential backoff: the delay schedule (pure; net/pause.py pauses on the loop)."""

from __future__ import annotations

import random
from typing import Literal

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
    ) -> None:
        self.initial_s = initial_s
        self.max_s = max_s
        self.jitter: Jitter = jitter
        self._rng = rng or random.Random()
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
