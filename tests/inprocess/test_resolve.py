"""resolve: lookups and their verdicts, retries under a deadline, and the real system resolver."""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

import pytest

from rallypoint.core.names import Resolution, Verdict, is_loopback
from rallypoint.net import resolve
from rallypoint.net.resolve import SystemResolver, check, verify
from tests.fakes import FakeResolver

# A deadline far enough away that only the test's own asyncio.timeout can end a hang.
PATIENT = 3600.0


@pytest.mark.parametrize(
    ("answer", "expected", "verdict", "detail_has"),
    [
        (["10.0.0.2"], None, Verdict.OK, "10.0.0.2"),
        (["10.0.0.2"], ["10.0.0.2", "10.0.1.2"], Verdict.OK, "10.0.0.2"),
        (["10.0.0.2"], [], Verdict.OK, "10.0.0.2"),
        (["2001:db8::2"], ["2001:DB8:0::2"], Verdict.OK, "2001:db8::2"),
        (["10.0.0.2"], ["::ffff:10.0.0.2"], Verdict.OK, "10.0.0.2"),
        (["127.0.1.1"], None, Verdict.LOOPBACK, "127.0.1.1"),
        (["::1"], ["10.0.0.2"], Verdict.LOOPBACK, "::1"),
        # Mixed answers: loopback anywhere counts, whatever its position.
        (["10.0.0.2", "127.0.1.1"], ["10.0.0.2"], Verdict.LOOPBACK, "127.0.1.1"),
        (["10.0.0.9"], ["10.0.0.2"], Verdict.MISMATCH, "10.0.0.2"),
        ([], None, Verdict.NOT_FOUND, "no address"),
        (
            socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
            None,
            Verdict.NOT_FOUND,
            "Name or service not known",
        ),
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            None,
            Verdict.NOT_FOUND,
            "Temporary failure",
        ),
    ],
)
async def test_check_verdicts(
    answer: list[str] | BaseException,
    expected: list[str] | None,
    verdict: Verdict,
    detail_has: str,
) -> None:
    fake = FakeResolver({"node1": answer})
    result = await check(fake, "node1", expected, timeout_s=5)
    assert result.verdict is verdict
    assert result.host == "node1"
    assert detail_has in result.detail
    assert "node1" in result.detail
    assert result.attempts == 1
    if isinstance(answer, list):
        assert result.addresses == tuple(answer)
    else:
        assert result.addresses == ()


async def test_check_unknown_name_is_not_found() -> None:
    result = await check(FakeResolver(), "ghost", None, timeout_s=5)
    assert result.verdict is Verdict.NOT_FOUND


async def test_check_deduplicates_preserving_order() -> None:
    fake = FakeResolver({"node1": ["10.0.0.3", "10.0.0.2", "10.0.0.3"]})
    result = await check(fake, "node1", None, timeout_s=5)
    assert result.addresses == ("10.0.0.3", "10.0.0.2")


async def test_check_times_out_without_stalling_the_loop() -> None:
    fake = FakeResolver()
    fake.set("slow", ["10.0.0.2"], hang=True)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticking = asyncio.create_task(ticker())
    try:
        result = await check(fake, "slow", None, timeout_s=0.2)
    finally:
        ticking.cancel()
    assert result.verdict is Verdict.TIMED_OUT
    assert "0.2s" in result.detail
    assert ticks >= 3


async def test_check_with_a_delay_inside_the_timeout_is_ok() -> None:
    fake = FakeResolver()
    fake.set("slowish", ["10.0.0.2"], delay_s=0.05)
    result = await check(fake, "slowish", None, timeout_s=5)
    assert result.verdict is Verdict.OK


async def test_verify_succeeds_once_the_name_appears() -> None:
    fake = FakeResolver()
    fake.set("late", ["10.0.0.2"], appear_after=3)
    result = await verify(
        fake,
        "late",
        ["10.0.0.2"],
        deadline=asyncio.get_running_loop().time() + PATIENT,
        timeout_s=5,
        backoff_initial_s=0.001,
        backoff_max_s=0.01,
        clock=asyncio.get_running_loop().time,
    )
    assert result.verdict is Verdict.OK
    assert result.attempts == 4
    assert fake.calls["late"] == 4


async def test_verify_picks_up_a_name_added_while_it_waits() -> None:
    fake = FakeResolver()
    loop = asyncio.get_running_loop()

    async def publish() -> None:
        await asyncio.sleep(0.05)  # verify's first attempt runs before this ends
        fake.set("late", ["10.0.0.2"])

    publisher = asyncio.create_task(publish())
    result = await verify(
        fake,
        "late",
        None,
        deadline=loop.time() + PATIENT,
        timeout_s=5,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
        clock=loop.time,
    )
    await publisher
    assert result.verdict is Verdict.OK
    assert result.attempts >= 2
    # Every attempt asked the resolver again: nothing was cached.
    assert fake.calls["late"] == result.attempts


async def test_verify_returns_the_last_failure_at_the_deadline() -> None:
    fake = FakeResolver({"gone": ["10.0.0.9"]})
    loop = asyncio.get_running_loop()
    result = await verify(
        fake,
        "gone",
        ["10.0.0.2"],
        deadline=loop.time() + 0.2,
        timeout_s=5,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
        clock=loop.time,
    )
    assert result.verdict is Verdict.MISMATCH
    assert result.attempts >= 2
    assert result.attempts == fake.calls["gone"]


class SteppingClock:
    """A clock that only moves when the fake resolver says a lookup took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowFake(FakeResolver):
    """Every lookup costs ``step`` seconds of the stepping clock."""

    def __init__(self, clock: SteppingClock, step: float) -> None:
        super().__init__()
        self.clock = clock
        self.step = step

    async def lookup(self, host: str) -> list[str]:
        self.clock.now += self.step
        return await super().lookup(host)


async def test_verify_starts_no_attempt_past_the_deadline() -> None:
    clock = SteppingClock()
    fake = SlowFake(clock, step=1.0)
    result = await verify(
        fake,
        "ghost",
        None,
        deadline=2.5,
        timeout_s=5,
        backoff_initial_s=0.001,
        backoff_max_s=0.001,
        clock=clock,
    )
    # Attempts start at 0, 1 and 2; at 3 the deadline (2.5) has passed.
    assert result.attempts == 3
    assert result.verdict is Verdict.NOT_FOUND
    assert result.elapsed_s == pytest.approx(3.0)


async def test_verify_never_sleeps_past_the_deadline() -> None:
    fake = FakeResolver()
    loop = asyncio.get_running_loop()
    # A huge backoff: a pause that ignored the deadline would outlive the guard below.
    async with asyncio.timeout(30):
        result = await verify(
            fake,
            "ghost",
            None,
            deadline=loop.time() + 0.2,
            timeout_s=5,
            backoff_initial_s=PATIENT,
            backoff_max_s=PATIENT,
            clock=loop.time,
        )
    assert result.verdict is Verdict.NOT_FOUND


async def test_verify_caps_a_hanging_lookup_at_the_deadline() -> None:
    fake = FakeResolver()
    fake.set("slow", ["10.0.0.2"], hang=True)
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(30):
        result = await verify(
            fake,
            "slow",
            None,
            deadline=loop.time() + 0.2,
            timeout_s=PATIENT,
            backoff_initial_s=0.01,
            backoff_max_s=0.01,
            clock=loop.time,
        )
    assert result.verdict is Verdict.TIMED_OUT
    assert result.attempts >= 1


async def test_verify_keeps_the_informative_answer_when_the_deadline_cuts_the_last_try() -> None:
    clock = SteppingClock()
    fake = FakeResolver({"gone": ["10.0.0.9"]})
    answers = iter([None, "hang"])

    class Flaky:
        async def lookup(self, host: str) -> list[str]:
            clock.now += 1.0
            if next(answers) == "hang":
                await asyncio.get_running_loop().create_future()
            return await fake.lookup(host)

    # The first try answers MISMATCH at t=1; the second starts with 0.01 s left and times out.
    result = await verify(
        Flaky(),
        "gone",
        ["10.0.0.2"],
        deadline=1.01,
        timeout_s=5,
        backoff_initial_s=0.001,
        backoff_max_s=0.001,
        clock=clock,
    )
    assert result.attempts == 2
    assert result.verdict is Verdict.MISMATCH


async def test_verify_with_a_past_deadline_makes_no_attempt() -> None:
    fake = FakeResolver({"node1": ["10.0.0.2"]})
    result = await verify(
        fake,
        "node1",
        None,
        deadline=-1.0,
        timeout_s=5,
        backoff_initial_s=0.01,
        backoff_max_s=0.01,
        clock=lambda: 0.0,
    )
    assert result.verdict is Verdict.TIMED_OUT
    assert result.attempts == 0
    assert fake.total_calls == 0


@pytest.mark.parametrize(
    ("accept_loopback", "verdict"), [(False, Verdict.LOOPBACK), (True, Verdict.OK)]
)
async def test_verify_loopback(accept_loopback: bool, verdict: Verdict) -> None:
    fake = FakeResolver({"node0": ["127.0.1.1"]})
    loop = asyncio.get_running_loop()
    result = await verify(
        fake,
        "node0",
        None,
        deadline=loop.time() + 0.1,
        timeout_s=5,
        backoff_initial_s=0.01,
        backoff_max_s=0.02,
        clock=loop.time,
        accept_loopback=accept_loopback,
    )
    assert result.verdict is verdict
    assert "127.0.1.1" in result.detail
    if accept_loopback:
        assert result.attempts == 1


async def test_system_resolver_localhost_is_loopback() -> None:
    async with SystemResolver(workers=2) as resolver:
        addresses = await resolver.lookup("localhost")
        result = await check(resolver, "localhost", None, timeout_s=10)
    assert addresses
    assert len(addresses) == len(set(addresses))
    assert all(is_loopback(address) for address in addresses)
    assert result.verdict is Verdict.LOOPBACK


@pytest.mark.parametrize("literal", ["192.0.2.7", "2001:db8::7"])
async def test_system_resolver_literal(literal: str) -> None:
    async with SystemResolver(workers=1) as resolver:
        result: Resolution = await check(resolver, literal, [literal], timeout_s=10)
    assert result.verdict is Verdict.OK
    assert result.addresses == (literal,)


async def test_system_resolver_invalid_name_is_not_found() -> None:
    async with SystemResolver(workers=1) as resolver:
        result = await check(resolver, "bad..name.invalid", None, timeout_s=10)
    assert result.verdict is Verdict.NOT_FOUND


async def test_system_resolver_a_slow_name_does_not_hold_up_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Names queue behind one thread; a hung lookup lets the queued names start elsewhere."""
    release = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        if host == "slow.test":
            release.wait(30)  # until the fast names were answered (or the test gave up)
            raise socket.gaierror(socket.EAI_NONAME, "not found")
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(resolve.socket, "getaddrinfo", getaddrinfo)
    async with SystemResolver(workers=2) as resolver:
        slow = asyncio.ensure_future(resolver.lookup("slow.test"))
        try:
            async with asyncio.timeout(20):
                fast = await asyncio.gather(*(resolver.lookup(f"n{i}.test") for i in range(5)))
        finally:
            release.set()
        assert fast == [["127.0.0.1"]] * 5
        with pytest.raises(socket.gaierror):
            await slow


async def test_system_resolver_gives_a_slow_resolver_every_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every lookup is slow (each waits for the others to start): the threads grow to all
    the workers instead of resolving one name at a time."""
    together = threading.Barrier(4)
    real = socket.getaddrinfo

    def getaddrinfo(host: str, *args: Any, **kwargs: Any) -> Any:
        together.wait(20)  # BrokenBarrierError unless four lookups run at once
        return real("127.0.0.1", *args, **kwargs)

    monkeypatch.setattr(resolve.socket, "getaddrinfo", getaddrinfo)
    async with SystemResolver(workers=4) as resolver:
        answers = await asyncio.gather(*(resolver.lookup(f"n{i}.test") for i in range(4)))
    assert answers == [["127.0.0.1"]] * 4


async def test_system_resolver_answers_many_names_at_once() -> None:
    async with SystemResolver(workers=3) as resolver:
        answers = await asyncio.gather(*(resolver.lookup("127.0.0.1") for _ in range(40)))
    assert answers == [["127.0.0.1"]] * 40


def test_system_resolver_needs_a_worker() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SystemResolver(workers=0)


def test_system_resolver_close_twice_is_safe() -> None:
    resolver = SystemResolver()
    resolver.close()
    resolver.close()
