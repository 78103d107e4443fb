"""A resumable stream given up on (cancel, grace) as its generation goes on or ends.

The producer is fed from the engine's callback while its task waits; a cancel
then ends the machine at once, and the tokens already on their way (the engine
is aborted only when the task runs) come after it. They are dropped, and a give
up that comes after the machine ended changes nothing: no internal error is
logged, and a stream that ended is recorded as it ended.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import cast

import pytest

from sluicegate.core.endstate import EndState
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.clocks import ManualClock
from sluicegate.server.resumable.producer import GRACE_EXPIRED, Producer
from sluicegate.server.stores.memory_store import MemoryEventStore
from sluicegate.server.streaming.buffer import LiveStreams, StreamBuffer
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.shared import StreamLimits

pytestmark = pytest.mark.anyio

ID = "chatcmpl-" + "0" * 32


class FakeGeneration:
    """What a producer asks of its generation: a buffer to attach, an abort."""

    def __init__(self) -> None:
        self.buffer: StreamBuffer | None = None
        self.aborted = False

    def attach(self, buffer: StreamBuffer) -> None:
        self.buffer = buffer

    def detach(self) -> None:
        self.buffer = None

    def abort_unfinished(self) -> None:
        self.aborted = True


Started = tuple[Producer, FakeGeneration, "asyncio.Task[None]", list[EndState]]


async def started(
    store: MemoryEventStore,
    grace_s: float = 30.0,
    *,
    create: bool = True,
    clock: ManualClock | None = None,
) -> Started:
    """A producer whose task waits with nothing queued (fed directly now)."""
    if create:
        await store.create(ID, "k")
    generation = FakeGeneration()
    ended: list[EndState] = []

    async def on_end(state: EndState, given_up: bool) -> None:
        ended.append(state)

    header = ResponseHeader(ID, 0, "m", Endpoint.CHAT)
    producer = Producer(
        store,
        cast(Generation, generation),
        header,
        StreamLimits(),
        LiveStreams(),
        grace_s,
        on_end,
        clock=clock,
    )
    task = asyncio.get_running_loop().create_task(producer.run())
    await asyncio.sleep(0)  # the task runs up to its first buffer.wait()
    assert generation.buffer is not None
    assert generation.buffer.direct is not None
    return producer, generation, task, ended


async def frames_of(store: MemoryEventStore) -> bytes:
    batches = [batch async for batch in store.read(ID, "k", -1)]
    return b"".join(frame for batch in batches for _, frame in batch)


async def test_tokens_after_a_cancel_are_dropped_without_an_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryEventStore()
    producer, generation, task, ended = await started(store)
    buffer = generation.buffer
    assert buffer is not None
    buffer.put(Delta(0, "a"))  # written from the callback
    assert producer.cancel()  # so is the error event: the machine ended
    buffer.put(Delta(0, "b"))  # in flight before the engine is aborted
    buffer.put(Delta(0, "c"))
    await task
    assert ended == [EndState.ABORTED]
    assert generation.aborted
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    body = await frames_of(store)
    assert b'"content":"a"' in body
    assert body.count(b'"code":"cancelled"') == 1
    assert b'"content":"b"' not in body


async def test_a_cancel_after_the_stream_ended_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryEventStore()
    producer, generation, task, ended = await started(store)
    buffer = generation.buffer
    assert buffer is not None
    buffer.put(Delta(0, "a"))
    buffer.put(Finish(0, FinishReason.STOP))
    buffer.put(End(Usage(1, 1)))  # the machine ended; the task is not yet run
    assert not producer.cancel()
    await task
    assert ended == [EndState.FINISHED]
    assert producer.abandoned is None
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    body = await frames_of(store)
    assert body.endswith(b"data: [DONE]\n\n")
    assert b"cancelled" not in body


async def test_with_no_reader_the_grace_timer_aborts_the_stream() -> None:
    store = MemoryEventStore()
    producer, generation, task, ended = await started(store, grace_s=0.01)
    await asyncio.wait_for(task, 5)  # no periodic check: one timer
    assert ended == [EndState.ABORTED]
    assert generation.aborted
    assert producer.abandoned is not None
    assert GRACE_EXPIRED.encode() in await frames_of(store)


async def test_a_reader_stops_the_grace_timer_and_its_leaving_starts_it() -> None:
    store = MemoryEventStore()
    await store.create(ID, "k")
    first = store.read(ID, "k", -1)
    assert await anext(first) == []
    clock = ManualClock()
    producer, _generation, task, ended = await started(
        store, grace_s=0.3, create=False, clock=clock
    )
    assert clock.next_due == math.inf  # a reader is attached: no timer runs
    clock.advance(0.4)
    assert producer.abandoned is None
    await first.aclose()
    assert clock.next_due == 0.4 + 0.3
    clock.advance(0.2)
    again = store.read(ID, "k", -1)  # back before the grace ran out
    await anext(again)
    assert clock.next_due == math.inf
    clock.advance(0.4)
    assert producer.abandoned is None
    await again.aclose()
    clock.advance(0.3)  # nobody came back this time: the timer ran
    assert clock.next_due == math.inf
    await asyncio.wait_for(task, 5)
    assert ended == [EndState.ABORTED]
    assert GRACE_EXPIRED.encode() in await frames_of(store)  # a late reader


async def test_a_finished_producer_stops_watching_its_readers() -> None:
    store = MemoryEventStore()
    clock = ManualClock()
    producer, generation, task, ended = await started(store, grace_s=0.3, clock=clock)
    assert clock.next_due == 0.3  # no reader yet: the timer runs
    reader = store.read(ID, "k", -1)
    await anext(reader)  # the timer armed at the start is stopped
    assert clock.next_due == math.inf
    buffer = generation.buffer
    assert buffer is not None
    buffer.put(Finish(0, FinishReason.STOP))
    buffer.put(End(Usage(1, 1)))
    await task
    await reader.aclose()
    assert clock.next_due == math.inf  # no timer: nothing is given up after the end
    clock.advance(0.4)
    assert ended == [EndState.FINISHED]
    assert producer.abandoned is None
    assert store._logs[ID].watcher is None  # the producer's call is gone


async def test_a_background_producer_has_no_grace_timer() -> None:
    store = MemoryEventStore()
    producer, _generation, task, ended = await started(store, grace_s=math.inf)
    assert store._logs[ID].watcher is None  # nothing to time
    await asyncio.sleep(0.05)
    assert producer.abandoned is None
    assert producer.cancel()
    await task
    assert ended == [EndState.ABORTED]
