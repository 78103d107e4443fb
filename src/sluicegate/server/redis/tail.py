"""RedisTail: one task that follows the live logs of every reader of one server.

A reader of a live log, once it has replayed what was kept, ``follow``s the log:
it gets a ``Follower`` whose ``next()`` returns the next batch of frames. One
task serves all of them with one ``XREAD BLOCK`` over every followed stream (one
connection, however many readers), from the lowest cursor of each stream's
followers, and hands each follower the entries past its own cursor. Every
``check_s`` it also extends the followers' reader leases and asks whether each
followed log's producer still leases (``redis_lua.REFRESH``).

Invariants:
    - A follower gets each frame once, in order, with no gap: an entry past
      ``cursor + 1`` (the frames were trimmed while it lagged) ends it with
      ``CursorEvicted``.
    - A log whose producer lost its lease before ``finish`` ends its followers
      with ``ProducerLost``, after every frame that log kept; a log that is gone
      (evicted, expired) ends them with ``CursorEvicted``; the end entry ends
      them cleanly.
    - A log produced by this server (in ``local``) is not read back: its
      store's ``append`` ``feed``s the frames straight to its followers (no
      round trip on a token's way), and ``feed_end`` ends them.
    - A follower that joins while an ``XREAD`` is blocked is read from the next
      one, at most ``block_ms`` later (short blocks rather than one connection
      per reader).

Spec: Redis documentation, "XREAD" (``BLOCK``, several streams).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.errors import (
    CursorEvicted,
    ProducerLost,
    RedisUnavailable,
    StoreError,
)
from sluicegate.server.redis.client import redis_errors
from sluicegate.server.redis.lua import REFRESH
from sluicegate.server.stores.event_store import Push

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["Follower", "RedisTail"]

logger = logging.getLogger(__name__)

Entry = tuple[bytes, dict[bytes, bytes]]
"""A stream entry as redis-py returns it: ``(id, {field: value})``."""


class Follower:
    """One reader following one live log (from ``RedisTail.follow``).

    With ``push`` (``PushRead``), frames handed over while ``next()`` waits go
    to ``push`` first, in the call that hands them over; ``next()`` returns
    only the batches it refuses.
    """

    def __init__(
        self, response_id: str, reader_id: str, cursor: int, push: Push | None = None
    ) -> None:
        self.response_id = response_id
        self.reader_id = reader_id
        self.cursor = cursor
        """The last seq handed to this follower."""
        self._push = push
        # The task waiting in next(): a batch may be pushed unless it is being
        # cancelled (its client left).
        self._waiting: asyncio.Task[object] | None = None
        self._frames: list[tuple[int, bytes]] = []
        self._early: dict[int, bytes] = {}  # fed past a gap a catch-up fills
        self._end_seq: int | None = None
        self._end: StoreError | bool | None = False  # False: not ended yet
        self._ready = asyncio.Event()

    async def next(self) -> list[tuple[int, bytes]] | None:
        """The next non-empty batch, or ``None`` once the log ended.

        Raises:
            ProducerLost, CursorEvicted, RedisUnavailable: the log ended so
                (after the frames it kept).
        """
        while not self._frames and self._end is False:
            self._ready.clear()
            self._waiting = asyncio.current_task()
            try:
                await self._ready.wait()
            finally:
                self._waiting = None
        if self._frames:
            frames, self._frames = self._frames, []
            return frames
        if isinstance(self._end, StoreError):
            raise self._end
        return None

    def take(self, entries: Sequence[Entry]) -> bool:
        """Hand over ``entries`` past the cursor; whether the follower ended."""
        for entry_id, fields in entries:
            seq = int(entry_id.rsplit(b"-", 1)[1]) - 1
            if seq <= self.cursor:
                continue
            if seq != self.cursor + 1:
                self.end(CursorEvicted(f"frames after {self.cursor} were dropped"))
                return True
            frame = fields.get(b"f")
            if frame is None:  # the end entry
                self.end(None)
                return True
            self._frames.append((seq, frame))
            self.cursor = seq
        self._hand_over()
        return False

    def offer(self, first_seq: int, frames: Sequence[bytes]) -> None:
        """Frames ``first_seq, first_seq + 1, ...`` from this server's own flush
        (or its catch-up read), in any order against each other: each is handed
        over once, in sequence order."""
        early = self._early
        for seq, frame in enumerate(frames, first_seq):
            if seq > self.cursor:
                early[seq] = frame
        while self.cursor + 1 in early:
            self.cursor += 1
            self._frames.append((self.cursor, early.pop(self.cursor)))
        if self._end_seq is not None and self.cursor + 1 >= self._end_seq:
            self.end(None)
        else:
            self._hand_over()

    def _hand_over(self) -> None:
        """Push the frames waiting for ``next()`` while it waits; else wake it."""
        frames = self._frames
        if not frames:
            return
        push, waiting = self._push, self._waiting
        if (
            push is not None
            and waiting is not None
            and not waiting.cancelling()
            and push(frames)
        ):
            self._frames = []
            return
        self._ready.set()  # not waiting, or refused (a write in flight)

    def end_at(self, end_seq: int) -> None:
        """The log ends before ``end_seq``: end once every earlier frame is out."""
        self._end_seq = end_seq
        self.offer(end_seq, [])

    def end(self, error: StoreError | None) -> None:
        """End the follower, with ``error`` or cleanly."""
        if self._end is False:
            self._end = error
        self._ready.set()


class RedisTail:
    """The followers of one server's live logs, and the task serving them.

    Args:
        client: from ``redis_client.connect``.
        prefix: the store's key prefix.
        block_ms: longest ``XREAD BLOCK`` (ms).
        check_s: seconds between lease checks (a third of the lease at most).
        lease_ms: a reader's lease (ms).

    Attributes:
        timers: the clock of the lease checks (``None``: the running loop).
    """

    timers: Timers | None = None

    def __init__(
        self,
        client: Redis,
        prefix: str,
        block_ms: int,
        check_s: float,
        lease_ms: int,
        local: set[str],
    ) -> None:
        self._client: Any = client  # redis-py's reply types are unions of all
        self._prefix = prefix
        self._block_ms = block_ms
        self._check_s = check_s
        self._lease_ms = lease_ms
        self._refresh = client.register_script(REFRESH)
        self._followers: dict[str, set[Follower]] = {}
        self._local = local
        self._joined = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def follow(
        self, response_id: str, reader_id: str, cursor: int, push: Push | None = None
    ) -> Follower:
        """Follow ``response_id`` past ``cursor`` (pushing to ``push`` while the
        reader waits, see ``Follower``); ``unfollow`` it when done."""
        follower = Follower(response_id, reader_id, cursor, push)
        self._followers.setdefault(response_id, set()).add(follower)
        self._joined.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return follower

    def feed(self, response_id: str, first_seq: int, frames: Sequence[bytes]) -> None:
        """Hand the followers of a log produced here the frames just appended."""
        for follower in self._followers.get(response_id, ()):
            follower.offer(first_seq, frames)

    def feed_end(self, response_id: str, end_seq: int) -> None:
        """A log produced here was finished: its end entry is ``end_seq``."""
        for follower in self._followers.get(response_id, ()):
            follower.end_at(end_seq)

    def fail(self, response_id: str, error: StoreError) -> None:
        """End the followers of a log produced here whose frames were lost."""
        for follower in self._followers.pop(response_id, ()):
            follower.end(error)

    def unfollow(self, follower: Follower) -> None:
        """Stop handing ``follower`` frames."""
        followers = self._followers.get(follower.response_id)
        if followers is not None:
            followers.discard(follower)
            if not followers:
                del self._followers[follower.response_id]

    async def aclose(self) -> None:
        """End every follower cleanly and stop the task."""
        for followers in list(self._followers.values()):
            for follower in followers:
                follower.end(None)
        self._followers.clear()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        timers = self.timers or asyncio.get_running_loop()
        check = Deadline(timers, self._check_s)
        while self._followers:
            try:
                if check.expired:
                    check = Deadline(timers, self._check_s)
                    await self._check()
                self._joined.clear()
                if self._followers.keys() - self._local:
                    await self._read()
                else:  # only logs fed by this server's appends
                    wake = Deadline(timers, self._check_s)
                    wake.call(self._joined.set)
                    await self._joined.wait()
                    wake.cancel()
            except RedisUnavailable as exc:
                logger.warning("%s: ending %d readers", exc, len(self._followers))
                self._end_all(exc)

    async def _read(self) -> None:
        streams: dict[Any, Any] = {}
        for response_id, followers in self._followers.items():
            if response_id in self._local:
                continue
            low = min(follower.cursor for follower in followers)
            streams[f"{self._prefix}log:{response_id}"] = f"0-{low + 1}"
        with redis_errors("following logs"):
            reply = await self._client.xread(streams, count=512, block=self._block_ms)
        skip = len(self._prefix) + 4
        for key, entries in reply or ():
            response_id = key[skip:].decode()
            for follower in list(self._followers.get(response_id, ())):
                if follower.take(entries):
                    self.unfollow(follower)

    async def _check(self) -> None:
        """Extend the reader leases; end the followers of lost or gone logs."""
        ids = list(self._followers)
        args: list[Any] = [self._prefix, self._lease_ms]
        for response_id in ids:
            readers = [follower.reader_id for follower in self._followers[response_id]]
            args += [response_id, len(readers), *readers]
        with redis_errors("checking leases"):
            states = await self._refresh(args=args)
        for response_id, state in zip(ids, states, strict=True):
            if state != b"live" and response_id not in self._local:
                await self._end_log(response_id, state == b"lost")

    async def _end_log(self, response_id: str, lost: bool) -> None:
        followers = self._followers.pop(response_id, set())
        if lost:  # the producer is dead: what it kept is all there is
            low = min((f.cursor for f in followers), default=0)
            with redis_errors("reading a lost log"):
                rest = await self._client.xrange(
                    f"{self._prefix}log:{response_id}", min=f"(0-{low + 1}"
                )
        for follower in followers:
            if lost and follower.take(rest):
                continue
            error: StoreError = (
                ProducerLost(f"the producer of {response_id!r} stopped leasing")
                if lost
                else CursorEvicted(f"the log {response_id!r} was dropped")
            )
            follower.end(error)

    def _end_all(self, error: StoreError) -> None:
        for followers in self._followers.values():
            for follower in followers:
                follower.end(error)
        self._followers.clear()
