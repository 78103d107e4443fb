"""LogWriter: the producer side of ``RedisEventStore``, one flusher for all logs.

``append``, ``lease`` and ``finish`` only queue; one flusher task sends
everything queued, for every log of this server, as one ``redis_lua.WRITE``
script call: one round trip per flush, however many streams, never one per
frame per stream. While a flush is in flight the next one fills, so the batches
grow with the load. Every ``lease_s / 3`` seconds the flusher also leases every
live log this server created, so a log's lease lapses only when its server stops.

Invariants:
    - A log's operations reach Redis in the order they were queued (its frames,
      then its ``finish``).
    - The frames of a log produced here go to its followers here at once (no
      round trip on a token's way), numbered by this server; they stay in
      ``unflushed`` until Redis took them, for a follower that joins to catch up.
    - A flush that fails breaks every log it carried: their followers here end
      with ``RedisUnavailable`` (``RedisFull`` when Redis is at ``maxmemory``),
      and their next ``append`` raises it. So does a flush that finds a live
      log produced here gone from Redis (restarted without persistence,
      flushed, evicted): the log is lost, never silently fed into nothing.
    - ``finish`` ends this server's readers of a log produced here at once
      (they have every frame): a flush that fails after it does not put an
      error after their last frame.
    - At most ``MAX_QUEUED_BYTES`` of frames wait for Redis before ``append``
      waits too (twice that, and ``append_nowait`` raises).

Spec: Redis documentation, "Pipelining", "Scripting with Lua".
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.errors import RedisUnavailable
from sluicegate.server.redis.client import redis_errors
from sluicegate.server.redis.lua import WRITE
from sluicegate.server.redis.tail import RedisTail

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["MAX_QUEUED_BYTES", "LogWriter"]

MAX_QUEUED_BYTES = 4 << 20
"""Frame bytes queued for the next flush past which ``append`` waits for it (a
Redis that keeps up is never waited for; a slow one slows the producers)."""
CLOSE_TIMEOUT_S = 5.0
"""Longest ``aclose`` waits for the cancelled flusher."""


@dataclass(slots=True)
class _Queued:
    """What one log has waiting for the next flush."""

    frames: list[bytes] = field(default_factory=list)
    lease: bool = False
    finish: bool = False


class LogWriter:
    """The queue and the flusher of one store's logs (see the module doc).

    Args:
        client: from ``redis_client.connect``.
        prefix: the store's key prefix.
        bounds: ``(max_log_bytes, max_store_bytes, lease_ms, ttl_ms)``.
        tail: the store's tail, fed the frames of logs produced here.
        live: the store's logs produced here and not finished (shared with the
            tail; this writer forgets a log once its finish is in Redis).

    Attributes:
        timers: the clock of the lease heartbeat (``None``: the running loop).
    """

    timers: Timers | None = None

    def __init__(
        self,
        client: Redis,
        prefix: str,
        bounds: tuple[int, int, int, int],
        tail: RedisTail,
        live: set[str],
    ) -> None:
        self._prefix = prefix
        self.max_log_bytes, self.max_store_bytes, self._lease_ms, self._ttl_ms = bounds
        self._write = client.register_script(WRITE)
        self._tail = tail
        self._live = live
        self._queued: dict[str, _Queued] = {}
        self._queued_bytes = 0
        self._broken: dict[str, RedisUnavailable] = {}
        self._next: dict[str, int] = {}  # the next seq of each log produced here
        self.unflushed: dict[str, list[tuple[int, bytes]]] = {}
        """Per log produced here, ``(seq, frame)`` appended but not in Redis yet."""
        self._flushed: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0
        """Flushes sent so far (one round trip each)."""

    def start(self, response_id: str) -> None:
        """``response_id`` was created here: number its frames from 0."""
        self._live.add(response_id)
        self._next[response_id] = 0
        self.unflushed[response_id] = []

    def untouched(self, response_id: str) -> bool:
        """Whether ``response_id`` was created here and nothing was appended."""
        return self._next.get(response_id) == 0

    async def append(self, response_id: str, frames: Sequence[bytes]) -> None:
        """See ``EventStore.append``: queued for the next flush, and handed to
        this server's readers of the log now. Waits for a flush only while more
        than ``MAX_QUEUED_BYTES`` are queued.

        Raises:
            RedisUnavailable: a flush that carried this log's frames failed
                (they are lost: the log is broken, and its readers here end).
        """
        self._enqueue(response_id, frames)
        if self._queued_bytes > MAX_QUEUED_BYTES:
            await self._flush_soon()

    def append_nowait(self, response_id: str, frames: Sequence[bytes]) -> None:
        """``append`` without a coroutine (from an engine's callback).

        Raises:
            RedisUnavailable: as ``append``; or more than twice
                ``MAX_QUEUED_BYTES`` wait for Redis (it is too slow to follow).
        """
        if self._queued_bytes > 2 * MAX_QUEUED_BYTES:
            raise RedisUnavailable(
                f"{self._queued_bytes} bytes of frames wait for Redis; it is behind"
            )
        self._enqueue(response_id, frames)

    def _enqueue(self, response_id: str, frames: Sequence[bytes]) -> None:
        error = self._broken.get(response_id)
        if error is not None:
            raise error
        self._queue(response_id).frames.extend(frames)
        self._queued_bytes += sum(map(len, frames))
        self._kick()
        unflushed = self.unflushed.get(response_id)
        if unflushed is not None:  # a log produced here: its readers here, at once
            first_seq = self._next[response_id]
            self._next[response_id] = first_seq + len(frames)
            unflushed.extend(enumerate(frames, first_seq))
            self._tail.feed(response_id, first_seq, frames)

    async def lease(self, response_id: str) -> None:
        """See ``EventStore.lease``. A log created here needs none: the flusher
        leases every such log every ``lease_s / 3`` seconds by itself."""
        if response_id not in self._live:
            self._queue(response_id).lease = True
            await self._flush_soon()

    async def flush(self) -> None:
        """Wait until everything queued so far is in Redis.

        Raises:
            RedisUnavailable: that flush failed.
        """
        await self._flush_soon()

    async def finish(self, response_id: str) -> None:
        """See ``EventStore.finish``: after the frames queued before it. The
        readers here of a log produced here have every frame already: they end
        now, whatever becomes of the flush.

        Raises:
            RedisUnavailable: the flush that carried it failed (the log is
                forgotten here: no more leases; readers elsewhere learn that
                its producer was lost).
        """
        self._broken.pop(response_id, None)
        end_seq = self._next.get(response_id)
        if end_seq is not None:
            self._tail.feed_end(response_id, end_seq)
        self._queue(response_id).finish = True
        try:
            await self._flush_soon()
        except RedisUnavailable:
            self._forget_local(response_id)
            self._broken.pop(response_id, None)
            raise

    async def aclose(self) -> None:
        """Send what is queued, then stop the flusher."""
        if self._queued and self._flusher is not None:
            with contextlib.suppress(RedisUnavailable):
                await self._flush_soon()
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            flusher.cancel()
            await asyncio.wait([flusher], timeout=CLOSE_TIMEOUT_S)  # never hangs

    def _queue(self, response_id: str) -> _Queued:
        queued = self._queued.get(response_id)
        if queued is None:
            queued = self._queued[response_id] = _Queued()
        return queued

    def _kick(self) -> None:
        """Have the flusher send what is queued (starting it if need be)."""
        if self._flusher is None or self._flusher.done():
            self._wake = asyncio.Event()
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())
        assert self._wake is not None
        self._wake.set()

    async def _flush_soon(self) -> None:
        """Wait for the flush that carries what is queued now.

        Raises:
            RedisUnavailable: that flush failed.
        """
        self._kick()
        if self._flushed is None:
            self._flushed = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._flushed)

    async def _flush_loop(self) -> None:
        wake = self._wake
        assert wake is not None
        interval_s = self._lease_ms / 3000
        timers = self.timers or asyncio.get_running_loop()
        lease = Deadline(timers, interval_s)
        while True:
            heartbeat = Deadline(timers, interval_s)
            heartbeat.call(wake.set)
            await wake.wait()
            heartbeat.cancel()
            wake.clear()
            if lease.expired:
                lease = Deadline(timers, interval_s)
                for response_id in self._live:
                    self._queue(response_id).lease = True
            queued, self._queued = self._queued, {}
            self._queued_bytes = 0
            done, self._flushed = self._flushed, None
            try:
                if queued:
                    await self._send(queued)
            except RedisUnavailable as exc:
                for response_id in queued:
                    self._broken[response_id] = exc
                    self._tail.fail(response_id, exc)
                if done is not None:
                    done.set_exception(exc)
                    done.exception()  # retrieved: a flush may have no waiter
            finally:
                if done is not None and not done.done():
                    if sys.exc_info()[0] is None:
                        done.set_result(None)
                    else:  # cancelled, or a bug: never leave a waiter hanging
                        done.set_exception(RedisUnavailable("the log flusher stopped"))
                        done.exception()

    async def _send(self, queued: dict[str, _Queued]) -> None:
        args: list[Any] = [
            self._prefix,
            self.max_log_bytes,
            self.max_store_bytes,
            self._lease_ms,
            self._ttl_ms,
        ]
        ops: list[tuple[str, list[bytes] | None]] = []  # None: finish
        for response_id, what in queued.items():
            if what.frames:
                args += [response_id, "a", len(what.frames), *what.frames]
                ops.append((response_id, what.frames))
            if what.lease:  # with frames too: a steady stream must lease as well
                args += [response_id, "l", 0]
                ops.append((response_id, []))
            if what.finish:
                args += [response_id, "f", 0]
                ops.append((response_id, None))
        with redis_errors("writing logs"):
            results = await self._write(args=args)
        self.flushes += 1
        tail = self._tail
        for (response_id, frames), result in zip(ops, results, strict=True):
            if frames:  # in Redis now (or dropped with a log that is gone)
                unflushed = self.unflushed.get(response_id)
                if unflushed is not None:
                    del unflushed[: len(frames)]
                elif result >= 0:  # a log produced elsewhere (not by this store)
                    tail.feed(response_id, result - len(frames), frames)
            if result < 0:  # gone or finished elsewhere: readers learn it by checks
                if frames is not None and response_id in self._live:
                    self._lose(response_id)
                self._forget_local(response_id)
            elif frames is None:
                self._forget_local(response_id)
                tail.feed_end(response_id, result)

    def _lose(self, response_id: str) -> None:
        """A log produced here and not finished is gone from Redis (a restart
        without persistence, a flush, an eviction): it is broken, as by a
        failed flush, so its producer's next append raises and its readers
        here end with the same error."""
        error = RedisUnavailable(
            f"Redis lost the log of {response_id!r} (restarted, flushed or evicted)"
        )
        self._broken[response_id] = error
        self._tail.fail(response_id, error)

    def _forget_local(self, response_id: str) -> None:
        self._live.discard(response_id)
        self._next.pop(response_id, None)
        self.unflushed.pop(response_id, None)
