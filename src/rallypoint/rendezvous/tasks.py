"""Tasks raced and stopped: a request against an event, a task cancelled whatever it raised."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


async def unless_set(request: Awaitable[T], event: asyncio.Event | None) -> asyncio.Future[T]:
    """Run ``request`` until it finishes or ``event`` is set; its future, done either way.

    The future is cancelled when the event came first (test ``future.cancelled()`` before
    asking its result). Whatever did not finish is cancelled and awaited before this returns,
    also when the caller itself is cancelled, so no task outlives the race. The event is left
    as it is: clearing it is the caller's business.
    """
    task = asyncio.ensure_future(request)
    waits: set[asyncio.Future[Any]] = {task}
    if event is not None:
        waits.add(asyncio.ensure_future(event.wait()))
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            if not waiting.done():
                waiting.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    return task


async def cancel_quietly(task: asyncio.Task[object] | None) -> None:
    """Cancel ``task`` and wait for it, whatever it raised."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
