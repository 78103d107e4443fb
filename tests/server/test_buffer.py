"""Outbox and StreamBuffer: put, poke, drain, wait, the direct hand-off and the
subclass hook."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from sluicegate.core.events import Delta, End, Heartbeat, StreamEvent, Usage
from sluicegate.engines.clocks import ManualClock
from sluicegate.server.streaming.buffer import EVENT_COST_BYTES, Outbox, StreamBuffer

pytestmark = pytest.mark.anyio


async def test_wait_returns_at_once_for_queued_events_or_no_time() -> None:
    outbox = Outbox()
    with anyio.fail_after(1):
        await outbox.wait(0)
        await outbox.wait(-1.0)
        outbox.put(Delta(0, "a"))
        await outbox.wait()
    assert outbox.drain() == [Delta(0, "a")]
    assert outbox.drain() == []


async def test_wait_returns_after_its_time_limit_when_nothing_comes() -> None:
    clock = ManualClock()
    outbox = Outbox(clock)
    waiting = asyncio.ensure_future(outbox.wait(0.05))
    await asyncio.sleep(0)
    clock.advance(0.049)
    await asyncio.sleep(0)
    assert not waiting.done()  # its time has not come on its clock
    clock.advance(0.001)
    with anyio.fail_after(5):
        await waiting
    assert outbox.drain() == []


@pytest.mark.parametrize("wake", ["put", "poke"])
async def test_put_or_poke_wakes_a_waiting_writer_before_its_time_limit(
    wake: str,
) -> None:
    outbox = Outbox()
    loop = asyncio.get_running_loop()
    if wake == "put":
        loop.call_soon(outbox.put, Heartbeat())
    else:
        loop.call_soon(outbox.poke)
    with anyio.fail_after(5):
        await outbox.wait(60)
    assert outbox.drain() == ([Heartbeat()] if wake == "put" else [])


async def test_direct_takes_events_only_while_the_writer_waits_on_nothing() -> None:
    buffer = StreamBuffer(10_000)
    taken: list[StreamEvent] = []
    buffer.direct = taken.append
    buffer.put(Delta(0, "queued"))  # nobody waits: queued and counted
    assert buffer.pending_bytes == len("queued") + EVENT_COST_BYTES
    assert buffer.drain() == [Delta(0, "queued")]

    loop = asyncio.get_running_loop()
    loop.call_soon(buffer.put, Delta(0, "direct"))
    loop.call_soon(buffer.poke)
    with anyio.fail_after(5):
        await buffer.wait()
    assert taken == [Delta(0, "direct")]
    assert (buffer.pending_bytes, buffer.drain()) == (0, [])


class _Recording(Outbox):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[StreamEvent] = []

    def _queued(self, event: StreamEvent) -> None:
        self.seen.append(event)


async def test_the_subclass_hook_sees_each_queued_event_before_it_is_drained() -> None:
    outbox = _Recording()
    outbox.put(Delta(0, "a"))
    outbox.put(End(Usage(1, 1)))
    assert outbox.seen == [Delta(0, "a"), End(Usage(1, 1))]
    assert outbox.drain() == outbox.seen


async def test_overflow_is_reported_once_past_max_bytes() -> None:
    calls: list[int] = []
    buffer = StreamBuffer(2 * EVENT_COST_BYTES, lambda: calls.append(1))
    buffer.put(Delta(0, "a"))
    assert calls == []
    buffer.put(Delta(0, "b"))
    buffer.put(Delta(0, "c"))
    assert (calls, buffer.overflowed) == ([1], True)
    assert buffer.drain() == [Delta(0, "abc")]
    assert buffer.coalesced == 2
    with pytest.raises(ValueError, match="max_bytes"):
        StreamBuffer(0)
