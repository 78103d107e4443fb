"""``Deadline``: a time limit on an injectable clock, stepped by the test."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sluicegate.engines.clocks import Deadline, ManualClock, ThreadTimers


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_a_deadline_calls_back_once_when_its_time_passes() -> None:
    clock = ManualClock(start=8.0)
    deadline = Deadline(clock, 2.0)
    fired: list[float] = []
    deadline.call(lambda: fired.append(clock.time()))
    clock.advance(1.5)  # binary fractions: exact sums
    assert (fired, deadline.expired, deadline.remaining_s) == ([], False, 0.5)
    clock.advance(0.5)
    assert (fired, deadline.expired, deadline.remaining_s) == ([10.0], True, 0.0)
    clock.advance(5)
    assert fired == [10.0]


def test_a_cancelled_deadline_calls_nothing() -> None:
    clock = ManualClock()
    deadline = Deadline(clock, 1.0)
    fired: list[str] = []
    deadline.call(lambda: fired.append("first"))
    deadline.call(lambda: fired.append("second"))  # replaces the first
    clock.advance(0.5)
    deadline.cancel()
    clock.advance(1)
    assert fired == []
    deadline.call(lambda: fired.append("late"))  # passed already: the next step
    clock.step()
    assert fired == ["late"]


@pytest.mark.anyio
async def test_a_body_past_its_deadline_ends_in_a_timeout_error() -> None:
    clock = ManualClock()
    never = asyncio.Event()
    entered = asyncio.Event()

    async def waits() -> str:
        try:
            async with Deadline(clock, 3.0):
                entered.set()
                await never.wait()
        except TimeoutError:
            return "timed out"
        return "ended"

    task = asyncio.create_task(waits())
    await entered.wait()
    clock.advance(2.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    assert await task == "timed out"


@pytest.mark.anyio
async def test_a_body_that_ends_in_time_is_not_cancelled_later() -> None:
    clock = ManualClock()
    async with Deadline(clock, 1.0) as deadline:
        await asyncio.sleep(0)
    clock.advance(2)
    await asyncio.sleep(0)  # no cancellation was left pending
    assert deadline.expired


@pytest.mark.anyio
async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    clock = ManualClock()
    entered = asyncio.Event()

    async def waits() -> None:
        async with Deadline(clock, 1.0):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(waits())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.anyio
async def test_waiting_for_a_deadline_returns_once_it_passes() -> None:
    clock = ManualClock()
    deadline = Deadline(clock, 2.0)
    task = asyncio.create_task(deadline.passed())
    await asyncio.sleep(0)
    clock.advance(1.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.1)
    await task
    assert deadline.expired


@pytest.mark.anyio
async def test_a_cancelled_wait_for_a_deadline_leaves_no_callback() -> None:
    clock = ManualClock()
    task = asyncio.create_task(Deadline(clock, 1.0).passed())
    await asyncio.sleep(0)
    assert clock.next_due == 1.0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.next_due == float("inf")


def test_thread_timers_call_back_in_a_thread_of_their_own() -> None:
    timers = ThreadTimers()
    called = threading.Event()
    threads: list[threading.Thread] = []

    def callback() -> None:
        threads.append(threading.current_thread())
        called.set()

    timers.call_at(timers.time() - 1.0, callback)  # passed already: at once
    assert called.wait(10)
    assert threads[0] is not threading.current_thread()
    timers.call_at(timers.time() + 3600.0, callback).cancel()
    assert threads == threads[:1]
