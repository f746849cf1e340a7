"""In-memory fakes for rallypoint's I/O seams, used instead of patching."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

Answer = list[str] | BaseException


@dataclass
class _Entry:
    answer: Answer
    delay_s: float = 0.0
    hang: bool = False
    appear_after: int = 0


class FakeResolver(MutableMapping[str, Answer]):
    """A Resolver over a mutable table: host -> addresses, or the exception its lookup raises.

    Per host, optionally: a delay before answering, a lookup that hangs until cancelled, or
    a name that is unknown for its first ``appear_after`` lookups. Unknown hosts raise
    socket.gaierror(EAI_NONAME) like getaddrinfo. ``calls`` counts lookups per host.
    """

    def __init__(self, table: Mapping[str, Sequence[str] | BaseException] | None = None) -> None:
        self._entries: dict[str, _Entry] = {}
        self.calls: Counter[str] = Counter()
        for host, answer in (table or {}).items():
            self.set(host, answer)

    def set(
        self,
        host: str,
        answer: Sequence[str] | BaseException,
        *,
        delay_s: float = 0.0,
        hang: bool = False,
        appear_after: int = 0,
    ) -> None:
        """Make ``host`` answer ``answer`` (addresses, or an exception to raise)."""
        stored: Answer = answer if isinstance(answer, BaseException) else list(answer)
        self._entries[host] = _Entry(stored, delay_s, hang, appear_after)

    def remove(self, host: str) -> None:
        """Make ``host`` unknown again; removing an unknown host is fine."""
        self._entries.pop(host, None)

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    async def lookup(self, host: str) -> list[str]:
        """The table's answer for ``host``, read after the delay (the name may change meanwhile)."""
        self.calls[host] += 1
        entry = self._entries.get(host)
        if entry is not None and entry.hang:
            await asyncio.get_running_loop().create_future()  # until cancelled
        if entry is not None and entry.delay_s:
            await asyncio.sleep(entry.delay_s)
        entry = self._entries.get(host)
        if entry is None or self.calls[host] <= entry.appear_after:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        if isinstance(entry.answer, BaseException):
            raise entry.answer
        return list(entry.answer)

    def __getitem__(self, host: str) -> Answer:
        return self._entries[host].answer

    def __setitem__(self, host: str, answer: Answer) -> None:
        self.set(host, answer)

    def __delitem__(self, host: str) -> None:
        del self._entries[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
