"""Outbox: put, poke, drain and wait (with and without a time limit)."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from sluicegate.core.events import Delta, Heartbeat
from sluicegate.server.generation import Outbox

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
    outbox = Outbox()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with anyio.fail_after(1):
        await outbox.wait(0.05)
    assert loop.time() - started >= 0.05 - 0.001
    assert outbox.drain() == []


@pytest.mark.parametrize("wake", ["put", "poke"])
async def test_put_or_poke_wakes_a_waiting_writer_before_its_time_limit(
    wake: str,
) -> None:
    outbox = Outbox()
    loop = asyncio.get_running_loop()
    if wake == "put":
        loop.call_later(0.01, outbox.put, Heartbeat())
    else:
        loop.call_later(0.01, outbox.poke)
    started = loop.time()
    with anyio.fail_after(1):
        await outbox.wait(10)
    assert loop.time() - started < 1
    assert outbox.drain() == ([Heartbeat()] if wake == "put" else [])
