"""Look names up the way torch and NCCL do (getaddrinfo), within deadlines; names.py judges."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from rallypoint import names
from rallypoint.backoff import Backoff
from rallypoint.lifecycle import AsyncResource
from rallypoint.names import Resolution, Verdict


class Resolver(Protocol):
    """Turns a host name into addresses; the seam tests replace with an in-memory fake."""

    async def lookup(self, host: str) -> list[str]:
        """The host's addresses, in resolver order; raises socket.gaierror when unknown."""
        ...


class SystemResolver(AsyncResource):
    """getaddrinfo on a bounded thread pool, so a slow name never stalls the event loop."""

    def __init__(self, workers: int = 16) -> None:
        if workers < 1:
            raise ValueError(f"resolver workers must be at least 1, got {workers}")
        self._executor = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="rallypoint-resolve"
        )

    async def start(self) -> None:
        """Nothing to acquire: the pool starts its threads on the first lookup."""

    async def lookup(self, host: str) -> list[str]:
        """The addresses getaddrinfo gives for ``host``, deduplicated, without scope ids."""
        loop = asyncio.get_running_loop()
        query = functools.partial(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
        try:
            infos = await loop.run_in_executor(self._executor, query)
        except UnicodeError as exc:
            # The IDNA codec rejects names such as "a..b" before any query is sent.
            raise socket.gaierror(socket.EAI_NONAME, f"invalid host name: {exc}") from exc
        return _dedupe(names.strip_scope(str(info[4][0])) for info in infos)

    def close(self) -> None:
        """Stop the pool without waiting for lookups that hang; closing twice is safe."""
        self._executor.shutdown(wait=False, cancel_futures=True)


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
    backoff = Backoff(backoff_initial_s, backoff_max_s)
    last: Resolution | None = None
    while (remaining := deadline - clock()) > 0:
        cut_short = remaining < timeout_s
        result = await check(resolver, host, expected, timeout_s=min(timeout_s, remaining))
        attempts += 1
        result = names.settle(result, accept_loopback=accept_loopback)
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
    return dataclasses.replace(last, attempts=attempts, elapsed_s=clock() - started)


def _dedupe(addresses: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(addresses))
