"""Readiness: not ready for reasons, the deadline, waiters, and shutdown that wins over all."""

from __future__ import annotations

import asyncio

from rallypoint.metrics import Metrics
from rallypoint.model import Env
from rallypoint.reasons import Reason
from rallypoint.rendezvous.readiness import Readiness


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(clock: Clock) -> Readiness:
    return Readiness(Metrics(), deadline_s=10.0, clock=clock, phase=Reason("starting", "starting"))


def test_the_deadline_adds_a_reason_until_it_is_restarted() -> None:
    clock = Clock()
    readiness = make(clock)
    assert [r.code for r in readiness.reasons()] == ["starting"]
    clock.now += 11
    assert [r.code for r in readiness.reasons()] == ["starting", "deadline_exceeded"]
    readiness.restart_deadline()
    assert [r.code for r in readiness.reasons()] == ["starting"]


async def test_ready_wakes_waiters_and_records_the_first_time() -> None:
    clock = Clock()
    readiness = make(clock)
    waiter = asyncio.create_task(readiness.wait_ready(5.0))
    await asyncio.sleep(0)
    assert readiness.env_waiters == 1
    clock.now += 2
    readiness.become_ready(Env(values=(("RANK", "0"),)), "g.1")
    assert await waiter is True
    assert readiness.reasons() == [] and readiness.ready_after_s == 2.0
    readiness.not_ready(Reason("verifying", "again"))
    assert readiness.env is None and not readiness.ready
    assert await readiness.wait_ready(0.01) is False


async def test_the_sidecars_own_waits_are_not_counted_as_env_waiters() -> None:
    readiness = make(Clock())
    own = asyncio.create_task(readiness.wait_ready(5.0, client=False))
    client = asyncio.create_task(readiness.wait_ready(5.0))
    await asyncio.sleep(0)
    assert readiness.env_waiters == 1
    readiness.become_ready(Env(values=(("RANK", "0"),)), "g.1")
    assert await own is True and await client is True
    assert readiness.env_waiters == 0


async def test_shutdown_is_final_and_ends_the_waits() -> None:
    readiness = make(Clock())
    waiter = asyncio.create_task(readiness.wait_ready(5.0))
    await asyncio.sleep(0)
    readiness.begin_shutdown()
    assert await waiter is False
    readiness.become_ready(Env(values=()), "g.1")
    readiness.not_ready(Reason("verifying", "ignored"))
    assert [r.code for r in readiness.reasons()] == ["shutting_down"]
