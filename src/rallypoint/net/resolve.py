"""Look names up the way torch and NCCL do (getaddrinfo), within deadlines; core/names.py judges."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import msgspec

from rallypoint.core import names
from rallypoint.core.backoff import Backoff
from rallypoint.core.lifecycle import AsyncResource
from rallypoint.core.names import Resolution, Verdict
from rallypoint.net.pause import Pause


class Resolver(Protocol):
    """Turns a host name into addresses; the seam tests replace with an in-memory fake."""

    async def lookup(self, host: str) -> list[str]:
        """The host's addresses, in resolver order; raises socket.gaierror when unknown."""
        ...


#: A lookup running longer than this lets the names queued behind it start on another thread.
STALL_S = 0.02


class SystemResolver(AsyncResource):
    """getaddrinfo on a bounded thread pool, so a slow name never stalls the event loop.

    Lookups queue up and one thread resolves them in turn, handing each answer back as it
    comes: waking a thread per name cost more than the lookups themselves when a cluster's
    nodes all check every peer name at once on a few cores (docs/performance.md, section 7).
    Whenever no queued name started for STALL_S (a name hangs on DNS, or every lookup is a
    slow DNS round trip), the threads double, up to ``workers`` and to the names waiting: one
    slow name delays the others by STALL_S, and a slow resolver gets ``workers`` threads
    within a few STALL_S.
    """

    def __init__(self, workers: int = 16) -> None:
        if workers < 1:
            raise ValueError(f"resolver workers must be at least 1, got {workers}")
        self._workers = workers
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="rallypoint-resolve"
        )
        # Shared with the pool's threads, under the lock.
        self._lock = threading.Lock()
        self._queue: deque[tuple[str, asyncio.Future[list[Any]], asyncio.AbstractEventLoop]] = (
            deque()
        )
        self._threads = 0  # drain jobs submitted and not finished
        self._started = 0  # lookups taken off the queue so far
        self._watching = False

    async def start(self) -> None:
        """Nothing to acquire: the pool starts its threads on the first lookup."""

    async def lookup(self, host: str) -> list[str]:
        """The addresses getaddrinfo gives for ``host``, deduplicated, without scope ids."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[list[Any]] = loop.create_future()
        with self._lock:
            self._queue.append((host, answer, loop))
            drain = self._threads == 0
            self._threads += drain
            watch, self._watching = not self._watching, True
            started = self._started
        if drain:
            self._executor.submit(self._drain)
        if watch:
            loop.call_later(STALL_S, self._watch, loop, started)
        try:
            infos = await answer
        except UnicodeError as exc:
            # The IDNA codec rejects names such as "a..b" before any query is sent.
            raise socket.gaierror(socket.EAI_NONAME, f"invalid host name: {exc}") from exc
        return _dedupe(names.strip_scope(str(info[4][0])) for info in infos)

    def close(self) -> None:
        """Stop the pool without waiting for lookups that hang; closing twice is safe."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _drain(self) -> None:
        """In a pool thread: resolve queued names until none is left."""
        while True:
            with self._lock:
                if not self._queue:
                    self._threads -= 1
                    return
                host, answer, loop = self._queue.popleft()
                self._started += 1
            if answer.done():
                continue  # the caller gave up (its timeout) before the lookup started
            try:
                infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except BaseException as exc:  # handed to the caller, as run_in_executor would
                result: list[Any] | BaseException = exc
            else:
                result = infos
            # A closed loop (RuntimeError) has nobody waiting for the answer.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, answer, result)

    def _watch(self, loop: asyncio.AbstractEventLoop, seen: int) -> None:
        """While names wait, double the threads whenever none of them started for STALL_S."""
        with self._lock:
            if not self._queue:
                self._watching = False
                return
            more = 0
            if self._started == seen:
                more = min(max(self._threads, 1), self._workers - self._threads, len(self._queue))
            self._threads += more
            seen = self._started
        for _ in range(more):
            self._executor.submit(self._drain)
        loop.call_later(STALL_S, self._watch, loop, seen)


def _settle(answer: asyncio.Future[list[Any]], result: list[Any] | BaseException) -> None:
    if answer.done():
        return
    if isinstance(result, BaseException):
        answer.set_exception(result)
    else:
        answer.set_result(result)


async def check(
    resolver: Resolver,
    host: str,
    expected: Collection[str] | None,
    *,
    timeout_s: float,
) -> Resolution:
    """One lookup of ``host`` within ``timeout_s``, classified; never raises for DNS trouble.

    ``expected`` holds the addresses the peer reported for itself; when it is given and not
    empty, an answer with none of them is a MISMATCH.
    """
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            found = await resolver.lookup(host)
    except TimeoutError:
        return names.timed_out(host, timeout_s, elapsed_s=time.monotonic() - started)
    except OSError as exc:  # socket.gaierror, and whatever else the resolver raised
        why = exc.strerror or str(exc) or type(exc).__name__
        return names.not_found(host, why, elapsed_s=time.monotonic() - started)
    return names.classify(host, found, expected, elapsed_s=time.monotonic() - started)


async def verify(
    resolver: Resolver,
    host: str,
    expected: Collection[str] | None,
    *,
    deadline: float,
    timeout_s: float,
    backoff_initial_s: float,
    backoff_max_s: float,
    clock: Callable[[], float] = time.monotonic,
    accept_loopback: bool = False,
) -> Resolution:
    """Retry :func:`check` with capped, full-jitter exponential backoff until OK or ``deadline``.

    ``deadline`` is a ``clock()`` time. No attempt starts and no pause ends past it. Returns the
    last informative Resolution (an attempt cut short by the deadline does not replace an
    earlier answer); with ``accept_loopback`` a LOOPBACK answer counts as OK.
    """
    started = clock()
    attempts = 0
    # Full jitter (a uniform pause up to the ceiling) spreads thousands of nodes that
    # started together.
    backoff = Pause(Backoff(backoff_initial_s, backoff_max_s))
    last: Resolution | None = None
    while (remaining := deadline - clock()) > 0:
        cut_short = remaining < timeout_s
        result = await check(resolver, host, expected, timeout_s=min(timeout_s, remaining))
        attempts += 1
        result = names.with_loopback_accepted(result, accept_loopback=accept_loopback)
        if result.verdict is Verdict.OK:
            last = result
            break
        if last is None or not (cut_short and result.verdict is Verdict.TIMED_OUT):
            last = result
        remaining = deadline - clock()
        if remaining <= 0:
            break
        await backoff.sleep(cap_s=remaining)  # the pause never runs past the deadline
    if last is None:
        return names.no_attempt(host)
    return msgspec.structs.replace(last, attempts=attempts, elapsed_s=clock() - started)


def _dedupe(addresses: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(addresses))
