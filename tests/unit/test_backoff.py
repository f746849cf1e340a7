"""The shared backoff: its delay schedule from tables (core/backoff.py), and a pause a wake
event cuts short (net/pause.py)."""

from __future__ import annotations

import asyncio
import random

import pytest

from rallypoint.core.backoff import Backoff, Jitter
from rallypoint.net.pause import Pause


def _delays(backoff: Backoff, n: int, cap_s: float | None = None) -> list[float]:
    return [backoff.next_s(cap_s) for _ in range(n)]


def test_the_ceiling_doubles_up_to_the_maximum() -> None:
    assert _delays(Backoff(0.5, 3.0, jitter="none"), 5) == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_reset_starts_again_from_the_first_delay() -> None:
    backoff = Backoff(1.0, 8.0, jitter="none")
    _delays(backoff, 3)
    backoff.reset()
    assert _delays(backoff, 2) == [1.0, 2.0]


@pytest.mark.parametrize(
    ("cap_s", "expected"), [(None, [1.0, 2.0, 4.0]), (1.5, [1.0, 1.5, 1.5]), (-1.0, [0.0] * 3)]
)
def test_a_deadline_caps_each_delay(cap_s: float | None, expected: list[float]) -> None:
    assert _delays(Backoff(1.0, 8.0, jitter="none"), 3, cap_s) == expected


def test_the_exponent_stops_growing_so_long_loops_do_not_overflow() -> None:
    assert _delays(Backoff(1e-9, 1e300, jitter="none"), 2000)[-1] == pytest.approx(1e-9 * 2**32)


@pytest.mark.parametrize(("jitter", "floor"), [("full", 0.0), ("half", 0.5), ("none", 1.0)])
def test_jitter_draws_between_its_floor_and_the_ceiling(jitter: Jitter, floor: float) -> None:
    backoff = Backoff(4.0, 4.0, jitter=jitter, rng=random.Random(7))
    delays = _delays(backoff, 200)
    assert all(floor * 4.0 <= d <= 4.0 for d in delays)
    # The draws fill their range, not one point of it.
    assert (max(delays) - min(delays) > 2.0) is (jitter == "full")


def test_a_seeded_rng_gives_the_same_delays() -> None:
    first = _delays(Backoff(0.1, 5.0, rng=random.Random(3)), 10)
    assert first == _delays(Backoff(0.1, 5.0, rng=random.Random(3)), 10)
    assert first != _delays(Backoff(0.1, 5.0, rng=random.Random(4)), 10)


async def test_a_wake_event_ends_the_pause_and_restarts_the_schedule() -> None:
    wake = asyncio.Event()
    schedule = Backoff(3600.0, 8 * 3600.0, jitter="none")
    backoff = Pause(schedule, wake=wake)
    assert _delays(schedule, 3)[-1] == 4 * 3600.0
    asyncio.get_running_loop().call_later(0.01, wake.set)
    async with asyncio.timeout(5):
        assert await backoff.sleep() is True
    assert not wake.is_set()
    assert schedule.next_s() == 3600.0


async def test_a_wake_set_before_the_pause_skips_it() -> None:
    wake = asyncio.Event()
    wake.set()
    async with asyncio.timeout(5):
        assert await Pause(Backoff(3600.0, 3600.0), wake=wake).sleep() is True
    assert not wake.is_set()


async def test_a_pause_without_a_wake_up_runs_its_course() -> None:
    wake = asyncio.Event()
    assert await Pause(Backoff(0.01, 0.01, jitter="none"), wake=wake).sleep() is False
    assert await Pause(Backoff(0.01, 0.01, jitter="none")).sleep() is False
