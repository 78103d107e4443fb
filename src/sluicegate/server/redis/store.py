"""RedisEventStore: the logs of resumable streams in Redis, readable from any replica.

An ``EventStore`` (``event_store.py``) for several server processes behind one
load balancer: a stream produced on replica A can be resumed on replica B. Each
log is a Redis Stream plus a metadata hash, a producer lease and a set of reader
leases; the key layout and the scripts are ``lua.py``'s.

Producer side: ``append``, ``lease`` and ``finish`` go to the store's
``LogWriter`` (``writer.py``): queued, then sent for every log of this
server in one script call per flush; ``append`` returns at once and hands the
frames to this server's readers of the log at once, so a client's own connection
never waits for Redis.

Reader side: ``read`` attaches (``ATTACH``: owner and cursor checked, a reader
lease taken), replays the kept frames with ``XRANGE`` in pages
(``replay.py``), then follows the
live tail through the server's one ``RedisTail`` task: a log produced by another
replica with ``XREAD``, one produced here fed by ``append`` itself (no read back).

Invariants:
    - Frame ``seq`` is the stream entry ``0-(seq+1)``: a replay from a cursor is
      one ``XRANGE``, and a gap in the numbers is an eviction, never silent.
    - Each log keeps at most ``max_log_bytes`` of frames (its last frame stays
      even when larger), trimmed in the same script run as the append that
      overflowed it; all logs together at most ``max_store_bytes``: finished
      logs are dropped first, oldest finish first, then the appending log's own
      oldest frames, and ``create`` raises ``StoreFull`` while live logs alone
      fill it. Redis's own memory should be bounded too (``maxmemory`` with
      ``noeviction``: past it writes fail, and ``RedisUnavailable`` says so).
    - A finished log is kept ``ttl_s`` seconds; a log whose producer stopped
      leasing is kept ``ttl_s`` past its last lease, for its readers to drain.
    - Redis unreachable: every call raises ``RedisUnavailable`` (a
      ``StoreError``); readers following a log end with it.

Deliberate divergence from ``MemoryEventStore``: a log dropped while a reader
reads it ends that reader with ``CursorEvicted`` rather than quietly.

Spec: Redis documentation, "Streams", "Pipelining"; WHATWG HTML, "Server-sent
events".
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import TYPE_CHECKING, Any

from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import CursorEvicted, LogNotFound, StoreFull
from sluicegate.server.redis.cancel import CancelChannel
from sluicegate.server.redis.client import redis_errors
from sluicegate.server.redis.lua import ATTACH, ATTACHED, CREATE, FORGET, SET_RECORD
from sluicegate.server.redis.replay import catch_up, read_page
from sluicegate.server.redis.tail import RedisTail
from sluicegate.server.redis.writer import LogWriter
from sluicegate.server.stores.event_store import (
    Bound,
    Frames,
    Push,
    StoreCapabilities,
)

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisEventStore", "open_redis_store"]

CLOSE_TIMEOUT_S = 5.0
"""Longest ``aclose`` waits for its cancelled tasks."""


class RedisEventStore:
    """Bounded, private logs of resumable streams in Redis (see the module doc).

    Args:
        client: from ``redis_client.connect`` (the caller closes it).
        max_log_bytes: bytes of frames one log keeps (>= 1).
        max_store_bytes: bytes of frames all logs keep together (>= 1).
        ttl_s: seconds a finished log is kept (> 0).
        lease_s: seconds a producer's or a reader's lease lasts (> 0): a reader
            learns of a dead producer about this long after it died.
        prefix: the start of every key.
        block_ms: longest ``XREAD BLOCK`` of the live tail (ms, >= 1).

    Raises:
        ValueError: a bound out of range.
    """

    def __init__(
        self,
        client: Redis,
        max_log_bytes: int = 1 << 20,
        max_store_bytes: int = 256 << 20,
        ttl_s: float = 600.0,
        lease_s: float = 3.0,
        prefix: str = "sluicegate:",
        block_ms: int = 100,
    ) -> None:
        if (
            min(max_log_bytes, max_store_bytes, block_ms) < 1
            or min(ttl_s, lease_s) <= 0
        ):
            raise ValueError(
                "expected max_log_bytes, max_store_bytes, block_ms >= 1 and ttl_s, "
                f"lease_s > 0, got {max_log_bytes!r}, {max_store_bytes!r}, "
                f"{block_ms!r}, {ttl_s!r}, {lease_s!r}"
            )
        self.max_log_bytes = max_log_bytes
        self.max_store_bytes = max_store_bytes
        self._client: Any = client  # redis-py's reply types are unions of all
        self._prefix = prefix
        self._lease_ms = max(1, int(lease_s * 1000))
        self._ttl_ms = max(1, int(ttl_s * 1000))
        self._create = client.register_script(CREATE)
        self._attach = client.register_script(ATTACH)
        self._attached = client.register_script(ATTACHED)
        self._set_record = client.register_script(SET_RECORD)
        self._forget = client.register_script(FORGET)
        self._live: set[str] = set()  # created here, not finished yet
        self._tail = RedisTail(
            client, prefix, block_ms, lease_s / 3, self._lease_ms, self._live
        )
        bounds = (max_log_bytes, max_store_bytes, self._lease_ms, self._ttl_ms)
        self._writer = LogWriter(client, prefix, bounds, self._tail, self._live)
        self.cancels = CancelChannel(client, prefix)
        """Cancel requests between replicas (``RemoteCancel``)."""
        self.capabilities = StoreCapabilities(
            eager_append=self, push_read=self, remote_cancel=self
        )
        """Not ``reader_watch`` (readers may be on other replicas) nor
        ``kept_bytes`` (Redis's own metrics tell)."""
        self._readers: dict[str, int] = {}  # readers on this server, per log
        self._background: set[asyncio.Task[Any]] = set()

    async def create(
        self, response_id: str, owner: str, idempotency: Bound | None = None
    ) -> Bound | None:
        """See ``EventStore.create``.

        Raises:
            StoreFull: live logs alone fill ``max_store_bytes``.
            RedisUnavailable: Redis cannot be reached.
        """
        idem = "" if idempotency is None else self._idem_key(owner, idempotency[0])
        body_hash = "" if idempotency is None else idempotency[1]
        args: list[Any] = [
            self._prefix,
            response_id,
            owner,
            self._lease_ms,
            self._ttl_ms,
        ]
        with redis_errors("creating a log"):
            reply = await self._create(
                args=[*args, self.max_store_bytes, idem, body_hash]
            )
        if reply[0] == b"bound":
            return reply[1].decode(), reply[2].decode()
        if reply[0] == b"full":
            raise StoreFull(
                f"the resumable-stream store holds {int(reply[1])} bytes of live "
                f"logs; its bound is {self.max_store_bytes}"
            )
        self._writer.start(response_id)
        self.cancels.start()  # this replica produces: listen for its cancels
        return None

    async def append(self, response_id: str, frames: Sequence[bytes]) -> None:
        """See ``EventStore.append`` and ``LogWriter.append`` (queued; handed to
        this server's readers at once)."""
        await self._writer.append(response_id, frames)

    def append_nowait(self, response_id: str, frames: Sequence[bytes]) -> None:
        """``append`` without a coroutine (``LogWriter.append_nowait``)."""
        self._writer.append_nowait(response_id, frames)

    async def lease(self, response_id: str) -> None:
        """See ``EventStore.lease`` (free for a log created here)."""
        await self._writer.lease(response_id)

    async def finish(self, response_id: str) -> None:
        """See ``EventStore.finish``: waits for the flush that carries it."""
        await self._writer.finish(response_id)

    async def flush(self) -> None:
        """Wait until everything queued so far is in Redis."""
        await self._writer.flush()

    async def attached(self, response_id: str) -> bool:
        """See ``EventStore.attached``: a reader on any replica counts (one on
        this server is known without asking Redis)."""
        if self._readers.get(response_id):
            return True
        with redis_errors("counting readers"):
            count = await self._attached(keys=[self._key("readers", response_id)])
        return int(count) > 0

    async def resumed(self, response_id: str) -> int:
        """See ``EventStore.resumed``."""
        with redis_errors("counting reads"):
            reads = await self._client.hget(self._key("meta", response_id), "reads")
        return 0 if reads is None else max(0, int(reads) - 1)

    def read(
        self, response_id: str, owner: str, after: int
    ) -> AsyncGenerator[Frames, None]:
        """See ``EventStore.read``. A cursor past the last frame reads only the
        frames appended after it (a finished log's read ends at once).

        Raises:
            RedisUnavailable: Redis cannot be reached (first or later).
        """
        return self._read(response_id, owner, after, None)

    def read_pushed(
        self, response_id: str, owner: str, after: int, push: Push
    ) -> AsyncGenerator[Frames, None]:
        """See ``PushRead.read_pushed``: a log produced here pushes from
        ``append`` (and ``append_nowait``), one produced elsewhere from the
        tail's read."""
        return self._read(response_id, owner, after, push)

    async def set_record(self, response_id: str, record: bytes) -> None:
        """See ``EventStore.set_record`` (a field of the log's meta hash: it
        expires and is forgotten with the log)."""
        with redis_errors("keeping a record"):
            await self._set_record(keys=[self._key("meta", response_id)], args=[record])

    async def record(self, response_id: str, owner: str) -> bytes | None:
        """See ``EventStore.record``."""
        with redis_errors("reading a record"):
            kept, record = await self._client.hmget(
                self._key("meta", response_id), "owner", "record"
            )
        if kept is None or kept.decode() != owner or not record:
            return None
        return bytes(record)

    async def delete(self, response_id: str, owner: str) -> bool:
        """See ``EventStore.delete``: this server's readers of the log end with
        ``CursorEvicted`` (the log is gone), as for an eviction."""
        await self._writer.flush()
        with redis_errors("deleting a log"):
            forgotten = await self._forget(args=[self._prefix, response_id, owner])
        return int(forgotten) == 1

    @property
    def flushes(self) -> int:
        """Flushes sent so far (one round trip each)."""
        return self._writer.flushes

    def on_cancel(self, handler: Callable[[str], None]) -> None:
        """See ``RemoteCancel.on_cancel`` (``CancelChannel``)."""
        self.cancels.listen(handler)

    async def request_cancel(self, response_id: str) -> bool:
        """See ``RemoteCancel.request_cancel``."""
        return await self.cancels.publish(response_id)

    async def aclose(self) -> None:
        """Send what is queued, stop the flusher and the cancel listener, end
        every reader."""
        await self.cancels.aclose()
        await self._writer.aclose()
        tasks = list(self._background)
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a shutdown never hangs on them
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        await self._tail.aclose()

    async def _read(
        self, response_id: str, owner: str, after: int, push: Push | None
    ) -> AsyncGenerator[Frames, None]:
        reader = secrets.token_hex(8)
        args: list[Any] = [
            self._prefix,
            response_id,
            owner,
            after,
            reader,
            self._lease_ms,
        ]
        with redis_errors("attaching a reader"):
            reply = await self._attach(args=args)
        if reply[0] == b"missing":
            raise LogNotFound(f"no resumable stream {response_id!r}")
        if reply[0] == b"evicted":
            raise CursorEvicted(
                f"frame {after + 1} of {response_id!r} was dropped; the oldest kept "
                f"is {int(reply[1])}"
            )
        if reply[0] == b"ended":  # a cursor at or past a finished log's end
            return
        follower = None
        self._readers[response_id] = self._readers.get(response_id, 0) + 1
        try:
            if after == -1 and self._writer.untouched(response_id):
                # Created here, nothing appended yet: every frame will reach
                # the follower from this server's appends; Redis has none.
                follower = self._tail.follow(response_id, reader, after, push)
                yield []
                while (frames := await follower.next()) is not None:
                    yield frames
                return
            first = True
            while True:  # the replay, page by page
                log = self._key("log", response_id)
                batch, ended, full = await read_page(
                    self._client, log, response_id, after
                )
                if batch:
                    after = batch[-1][0]
                if batch or (first and not ended):  # past a finished end: none
                    yield batch
                first = False
                if ended:
                    return
                if not full:
                    break
            follower = self._tail.follow(response_id, reader, after, push)
            if response_id in self._live:
                unflushed = self._writer.unflushed.get(response_id, ())
                await catch_up(
                    self._client, self._key("log", response_id), unflushed, follower
                )
            while (frames := await follower.next()) is not None:
                yield frames
        finally:
            if follower is not None:
                self._tail.unfollow(follower)
            if self._readers[response_id] > 1:
                self._readers[response_id] -= 1
            else:
                del self._readers[response_id]
            self._detach(response_id, reader)

    def _detach(self, response_id: str, reader: str) -> None:
        """Drop the reader's lease, in the background (a finally may not wait)."""
        key = self._key("readers", response_id)
        with contextlib.suppress(RuntimeError):  # no running loop: it lapses
            task = asyncio.get_running_loop().create_task(
                self._client.zrem(key, reader)
            )
            self._background.add(task)
            task.add_done_callback(self._settle)

    def _settle(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()  # a lease that could not be dropped lapses by itself

    def _key(self, kind: str, response_id: str) -> str:
        return f"{self._prefix}{kind}:{response_id}"

    def _idem_key(self, owner: str, key: str) -> str:
        return f"{self._prefix}idem:{len(owner)}:{owner}:{key}"


def open_redis_store(client: Redis, config: ServerConfig) -> RedisEventStore:
    """The Redis store of ``config``'s resumable streams (``redis_url`` set):
    bounded by ``max_log_bytes``, ``max_store_bytes`` and ``resume_ttl_s``."""
    return RedisEventStore(
        client, config.max_log_bytes, config.max_store_bytes, config.resume_ttl_s
    )
