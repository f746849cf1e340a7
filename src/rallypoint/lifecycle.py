"""AsyncResource: `async with` for a resource that has start() and close()."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class AsyncResource(ABC):
    """`async with` runs start(), and close() on exit or when start() fails.

    close() must be safe twice and after a partial start: both paths may reach it.
    """

    @abstractmethod
    async def start(self) -> None:
        """Acquire what the resource holds."""

    @abstractmethod
    async def close(self) -> None:
        """Release everything start() acquired; closing twice is safe."""

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
