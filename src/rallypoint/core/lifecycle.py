"""AsyncResource: `async with` for a resource that has start() and close()."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable
from types import TracebackType
from typing import Self


class AsyncResource(ABC):
    """`async with` runs start(), and close() on exit or when start() fails.

    close() must be safe twice and after a partial start: both paths may reach it. It may be
    a plain method where releasing needs no await (a thread pool's shutdown), so that callers
    outside `async with` can close the resource without an event loop.
    """

    @abstractmethod
    async def start(self) -> None:
        """Acquire what the resource holds."""

    @abstractmethod
    def close(self) -> Awaitable[None] | None:
        """Release everything start() acquired; closing twice is safe."""

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        pending = self.close()
        if pending is not None:
            await pending
