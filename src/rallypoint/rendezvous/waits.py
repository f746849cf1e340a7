"""Waiting, within a deadline, for a condition that an event announces: a long-poll's answer
(the master's book, its verdict, a relay) and a relay's gathering of a batch."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


async def wait_until(
    done: Callable[[], bool], event: Callable[[], asyncio.Event], timeout_s: float
) -> bool:
    """Whether ``done()`` held within ``timeout_s``, checked again whenever ``event()`` fires
    (a callable: the book, the verdict and the relay replace an event once they set it)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not done():
        left = end - loop.time()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(event().wait(), left)
        except TimeoutError:
            return False
    return True


async def coalesce(due: asyncio.Event, complete: Callable[[], bool], window_s: float) -> None:
    """Wait until ``complete()`` or ``window_s`` passed, clearing ``due`` before each wait and
    checking again when it is set, so a herd goes up as one batch."""
    loop = asyncio.get_running_loop()
    end = loop.time() + window_s
    while not complete() and (left := end - loop.time()) > 0:
        due.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(due.wait(), left)
