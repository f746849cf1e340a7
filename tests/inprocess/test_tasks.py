"""tasks.unless_set: a request raced against an event leaves no task behind, whoever wins."""

from __future__ import annotations

import asyncio

import pytest

from rallypoint.rendezvous.tasks import unless_set


class Request:
    """A request that answers when told to, and records how it ended."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.ended = ""

    async def __call__(self) -> str:
        try:
            return await self.answer
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        finally:
            self.ended = self.ended or "finished"


def others() -> set[asyncio.Task[object]]:
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[arg-type]


async def test_the_request_answers_first() -> None:
    request, event = Request(), asyncio.Event()
    request.answer.set_result("doc")
    future = await unless_set(request(), event)
    assert future.result() == "doc" and request.ended == "finished"
    assert not event.is_set() and not others()


async def test_the_event_comes_first() -> None:
    request, event = Request(), asyncio.Event()
    asyncio.get_running_loop().call_soon(event.set)
    future = await unless_set(request(), event)
    assert future.cancelled() and request.ended == "cancelled"
    assert event.is_set()  # left for the caller to clear
    assert not others()


async def test_without_an_event_the_request_alone_is_awaited() -> None:
    request = Request()
    asyncio.get_running_loop().call_later(0.01, request.answer.set_result, "verdict")
    future = await unless_set(request(), None)
    assert future.result() == "verdict"


async def test_a_failed_request_keeps_its_exception() -> None:
    request, event = Request(), asyncio.Event()
    request.answer.set_exception(ConnectionResetError("gone"))
    future = await unless_set(request(), event)
    with pytest.raises(ConnectionResetError):
        future.result()
    assert not others()


async def test_a_cancelled_caller_leaves_no_task_behind() -> None:
    request, event = Request(), asyncio.Event()
    caller = asyncio.ensure_future(unless_set(request(), event))
    await asyncio.sleep(0.01)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert request.ended == "cancelled"
    assert not others()
