"""A resumable stream's producer when its store fails under it.

The store here is the memory store behind a switch that makes every call fail
with ``StoreError`` (as a shared store does when Redis is killed), with no
``append_nowait`` and no ``ReaderWatch``: the producer takes the path it takes
on Redis (the task appends, a watcher checks the readers). The real Redis
cases are ``tests/integration/test_state_store_faults.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import cast

import pytest

from sluicegate.core.endstate import EndState
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.clocks import ManualClock
from sluicegate.server.http.errors import (
    STORE_FULL,
    STORE_UNAVAILABLE,
    StoreError,
    StoreFull,
    store_error_code,
)
from sluicegate.server.resumable.producer import Producer
from sluicegate.server.stores.event_store import EventStore, StoreCapabilities
from sluicegate.server.stores.memory_log import frames_since
from sluicegate.server.stores.memory_store import MemoryEventStore
from sluicegate.server.streaming.buffer import LiveStreams
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.shared import StreamLimits
from tests.polling import wait_until

from .test_resumable_give_up import FakeGeneration

pytestmark = pytest.mark.anyio

ID = "chatcmpl-" + "1" * 32


class SwitchedStore:
    """The memory store, every producer call failing once ``down`` is set."""

    def __init__(self) -> None:
        self.capabilities = StoreCapabilities()  # it asks attached() on a timer
        self.inner = MemoryEventStore()
        self.down: StoreError | None = None
        self.checks = 0

    def _check(self) -> None:
        if self.down is not None:
            raise self.down

    async def create(self, response_id: str, owner: str) -> None:
        await self.inner.create(response_id, owner)

    async def append(self, response_id: str, frames: Sequence[bytes]) -> None:
        self._check()
        await self.inner.append(response_id, frames)

    async def lease(self, response_id: str) -> None:
        self.checks += 1
        self._check()

    async def attached(self, response_id: str) -> bool:
        self._check()
        return True

    async def finish(self, response_id: str) -> None:
        self._check()
        await self.inner.finish(response_id)


async def _producer(
    store: SwitchedStore, clock: ManualClock | None = None
) -> tuple[FakeGeneration, asyncio.Task[None], list[EndState]]:
    await store.create(ID, "k")
    generation = FakeGeneration()
    ended: list[EndState] = []

    async def on_end(state: EndState, given_up: bool) -> None:
        ended.append(state)

    producer = Producer(
        cast(EventStore, store),
        cast(Generation, generation),
        ResponseHeader(ID, 0, "m", Endpoint.CHAT),
        StreamLimits(),
        LiveStreams(),
        30.0,
        on_end,
        check_interval_s=0.01,
        clock=clock,
    )
    task = asyncio.get_running_loop().create_task(producer.run())
    await asyncio.sleep(0)
    assert generation.buffer is not None
    return generation, task, ended


async def test_a_store_failing_mid_stream_ends_it_errored_and_aborts_the_engine() -> (
    None
):
    store = SwitchedStore()
    clock = ManualClock()
    generation, task, ended = await _producer(store, clock)
    assert generation.buffer is not None
    generation.buffer.put(Delta(0, "Hel"))
    await wait_until(lambda: any(b"Hel" in frame for frame in _kept_now(store)))
    store.down = StoreError("Redis failed while writing logs: host:port")
    # The watcher meets the failure and goes on checking, once a check interval.
    for checks in range(1, 4):
        clock.advance(0.01)
        await wait_until(lambda: store.checks >= checks)  # noqa: B023
    assert store.checks == 3
    assert not task.done()
    generation.buffer.put(Delta(0, "lo"))
    await asyncio.wait_for(task, 5)
    assert ended == [EndState.ERRORED]
    assert generation.aborted
    # What the store kept: the content before the failure; the error event and
    # the finish could not be written (its readers write the event).
    frames = await asyncio.wait_for(_kept(store), 1)
    assert any(b"Hel" in frame for frame in frames)
    assert not any(b"error" in frame for frame in frames)


def _kept_now(store: SwitchedStore) -> list[bytes]:
    """The frames the inner store keeps now."""
    return [frame for _, frame in frames_since(store.inner._logs[ID], -1)]


async def _kept(store: SwitchedStore) -> list[bytes]:
    """The frames the inner store kept (its first batch: all of them)."""
    reader = store.inner.read(ID, "k", -1)
    try:
        return [frame for _, frame in await anext(reader)]
    finally:
        await cast(AsyncGenerator[object], reader).aclose()


async def test_a_store_failing_on_the_last_frames_still_records_errored() -> None:
    store = SwitchedStore()
    generation, task, ended = await _producer(store)
    assert generation.buffer is not None
    generation.buffer.put(Delta(0, "Hi"))
    await wait_until(lambda: any(b"Hi" in frame for frame in _kept_now(store)))
    store.down = StoreFull("Redis is full (maxmemory) while writing logs")
    generation.buffer.put(Finish(0, FinishReason.STOP))
    generation.buffer.put(End(Usage(1, 1)))
    await asyncio.wait_for(task, 5)
    assert ended == [EndState.ERRORED]


def test_a_full_store_has_its_own_code() -> None:
    assert store_error_code(StoreFull("full")) == STORE_FULL
    assert store_error_code(StoreError("gone")) == STORE_UNAVAILABLE
