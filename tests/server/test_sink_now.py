"""``FrameSink`` with a write ``now``: tried first, from a callback or a task.

A destination that can write without a coroutine (``ChunkedBodySend.write_now``)
is written that way whenever it says it can; when it says it cannot, the same
frames go through the coroutine (``start``), and its failures are reported as
the coroutine's would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sluicegate.engines.clocks import ManualClock
from sluicegate.server.streaming.sink import BUSY, FAILED, WROTE, FrameSink
from sluicegate.server.streaming.write_watch import WriteWatch

pytestmark = pytest.mark.anyio


class Destination:
    """Takes writes ``now`` while ``ready``; its coroutine may wait on ``gate``."""

    def __init__(self) -> None:
        self.ready = True
        self.fails: BaseException | None = None
        self.now_wrote: list[bytes] = []
        self.started: list[bytes] = []
        self.gate: asyncio.Future[None] | None = None

    def now(self, frames: Sequence[bytes]) -> bool:
        if self.fails is not None:
            raise self.fails
        if not self.ready:
            return False
        self.now_wrote.append(b"".join(frames))
        return True

    async def start(self, frames: Sequence[bytes]) -> None:
        if self.gate is not None:
            await self.gate
        self.started.append(b"".join(frames))


def sink_of(destination: Destination, woken: list[int]) -> tuple[FrameSink, WriteWatch]:
    clock = ManualClock()
    watch = WriteWatch(15.0, 30.0, lambda: None, lambda: None, clock)
    sink = FrameSink(
        destination.start,
        watch,
        on_pending=lambda: woken.append(1),
        now=destination.now,
    )
    clock.advance(2.0)
    return sink, watch


async def test_an_offer_is_written_now_when_the_destination_can() -> None:
    destination, woken = Destination(), list[int]()
    sink, watch = sink_of(destination, woken)
    assert sink.offer([b"a", b"b"]) is WROTE
    assert destination.now_wrote == [b"ab"]
    assert destination.started == []
    assert watch.last_write == 2.0  # the write counts against silence
    assert sink.idle
    assert woken == []


async def test_an_offer_goes_through_the_coroutine_when_now_cannot() -> None:
    destination, woken = Destination(), list[int]()
    sink, _ = sink_of(destination, woken)
    destination.ready = False
    assert sink.offer([b"a"]) is WROTE  # the coroutine did not suspend
    assert destination.started == [b"a"]
    destination.gate = asyncio.get_running_loop().create_future()
    assert sink.offer([b"b"]) is not WROTE  # it waits: the task finishes it
    assert woken == [1]
    assert sink.offer([b"c"]) is BUSY
    destination.gate.set_result(None)
    assert await sink.settle()
    assert destination.started == [b"a", b"b"]
    assert destination.now_wrote == []


async def test_a_broken_connection_met_now_is_reported_by_settle() -> None:
    destination, woken = Destination(), list[int]()
    sink, _ = sink_of(destination, woken)
    destination.fails = ConnectionResetError()
    assert sink.offer([b"a"]) is FAILED
    assert woken == [1]
    assert sink.offer([b"b"]) is BUSY
    assert not await sink.settle()
    assert destination.started == []


async def test_a_lossy_offer_that_meets_a_broken_connection_keeps_nothing() -> None:
    destination, woken = Destination(), list[int]()
    sink, _ = sink_of(destination, woken)
    destination.fails = ConnectionResetError()
    assert sink.offer([b"a"], lossy=True) is FAILED
    assert sink.idle
    assert woken == []


async def test_another_failure_met_now_is_raised_by_settle() -> None:
    destination, woken = Destination(), list[int]()
    sink, _ = sink_of(destination, woken)
    destination.fails = RuntimeError("a bug")
    assert sink.offer([b"a"], lossy=True) is FAILED
    with pytest.raises(RuntimeError, match="a bug"):
        await sink.settle()


async def test_the_tasks_write_is_written_now_first() -> None:
    destination, woken = Destination(), list[int]()
    sink, watch = sink_of(destination, woken)
    assert await sink.write([b"a"])
    destination.ready = False
    assert await sink.write([b"b"])
    assert destination.now_wrote == [b"a"]
    assert destination.started == [b"b"]
    assert watch.write_started is None
    destination.fails = BrokenPipeError()
    assert not await sink.write([b"c"])
