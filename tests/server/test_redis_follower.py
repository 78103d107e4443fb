"""Follower (the Redis store's live reader) without Redis: what it hands over,
pushed or returned, as frames reach it."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from sluicegate.server.redis.tail import Follower
from sluicegate.server.stores.event_store import Frames

pytestmark = pytest.mark.anyio


class Taker(list[Frames]):
    """A push that takes every batch, and keeps them."""

    def __call__(self, batch: Frames) -> bool:
        self.append(batch)
        return True


def entry(seq: int) -> tuple[bytes, dict[bytes, bytes]]:
    return (b"1-%d" % (seq + 1), {b"f": b"data: %d\n\n" % seq})


async def test_frames_reach_a_waiting_follower_by_push_else_by_next() -> None:
    pushed = Taker()
    follower = Follower("r", "reader", -1, pushed)
    follower.offer(0, [b"data: 0\n\n"])  # nobody waits: kept for next()
    assert await follower.next() == [(0, b"data: 0\n\n")]
    waiting = asyncio.get_running_loop().create_task(follower.next())
    await asyncio.sleep(0)  # next() waits
    follower.take([entry(1), entry(2)])
    assert pushed == [[(1, b"data: 1\n\n"), (2, b"data: 2\n\n")]]
    follower.end(None)
    with anyio.fail_after(5):
        assert await waiting is None


async def test_a_follower_whose_wait_was_cancelled_is_not_pushed_to() -> None:
    pushed = Taker()
    follower = Follower("r", "reader", -1, pushed)
    waiting = asyncio.get_running_loop().create_task(follower.next())
    await asyncio.sleep(0)  # next() waits
    waiting.cancel()  # the client left ...
    follower.offer(0, [b"data: 0\n\n"])  # ... and a frame came in the same turn
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pushed == []
    assert await follower.next() == [(0, b"data: 0\n\n")]  # still there, once
