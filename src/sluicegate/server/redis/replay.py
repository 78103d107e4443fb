"""The replay of a Redis log: its kept frames after a cursor, and a follower's catch-up.

A log's frame ``seq`` is the stream entry ``0-(seq+1)`` and its end is an entry
without a frame field, so a replay from a cursor is one ``XRANGE`` per page and a
gap in the numbers is an eviction (``CursorEvicted``), never silent.
``redis_store.RedisEventStore`` replays with ``read_page``, then follows the
live tail; a follower of a log produced here first gets ``catch_up``.

Spec: Redis documentation, "Streams" (``XRANGE``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluicegate.server.http.errors import CursorEvicted
from sluicegate.server.redis.client import redis_errors
from sluicegate.server.redis.tail import Follower

__all__ = ["PAGE_FRAMES", "catch_up", "read_page"]

PAGE_FRAMES = 512
"""Frames per ``XRANGE`` page of a replay (one batch each)."""


async def read_page(
    client: Any, log: str, response_id: str, after: int
) -> tuple[list[tuple[int, bytes]], bool, bool]:
    """Up to ``PAGE_FRAMES`` kept frames of the log at key ``log`` after
    ``after``: ``(frames, ended, full)``; ``ended`` once the end entry was read.

    Raises:
        CursorEvicted: a frame after ``after`` was dropped while it was read.
        RedisUnavailable: Redis cannot be reached.
    """
    with redis_errors("replaying a log"):
        entries = await client.xrange(log, min=f"(0-{after + 1}", count=PAGE_FRAMES)
    frames: list[tuple[int, bytes]] = []
    for entry_id, fields in entries:
        seq = int(entry_id.rsplit(b"-", 1)[1]) - 1
        if seq != after + 1:
            raise CursorEvicted(
                f"frame {after + 1} of {response_id!r} was dropped while it was read"
            )
        frame = fields.get(b"f")
        if frame is None:
            return frames, True, False
        frames.append((seq, frame))
        after = seq
    return frames, False, len(entries) == PAGE_FRAMES


async def catch_up(
    client: Any,
    log: str,
    unflushed: Sequence[tuple[int, bytes]],
    follower: Follower,
) -> None:
    """Give a new follower of a log produced here what was appended between
    its replay and its joining: what Redis has at key ``log``, and what waits
    for a flush (``unflushed``; appends after it feed it directly).

    Raises:
        RedisUnavailable: Redis cannot be reached.
    """
    after = follower.cursor
    for seq, frame in unflushed:
        follower.offer(seq, [frame])
    with redis_errors("replaying a log"):
        entries = await client.xrange(log, min=f"(0-{after + 1}")
    for entry_id, fields in entries:
        seq = int(entry_id.rsplit(b"-", 1)[1]) - 1
        if seq > after + 1 and follower.cursor == after:
            follower.end(CursorEvicted(f"frames after {after} were dropped"))
            return
        frame = fields.get(b"f")
        if frame is None:
            follower.end_at(seq)
        else:
            follower.offer(seq, [frame])
