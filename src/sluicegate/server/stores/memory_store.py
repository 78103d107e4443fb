"""MemoryEventStore: the logs of resumable streams in this process's memory.

The default ``EventStore`` (``event_store.py``), for one server process: each log
is a deque of frames with the sequence number of its first kept frame, so an
append is O(1) per frame and a replay from a cursor is an index; once the log
is finished, a tuple, which the garbage collector does not walk. Readers wait
on a future each, set by each append and by ``finish``; a reader that pushes
(``read_pushed``) is handed each append's frames in the append's call instead,
until it refuses a batch. One log's own state is ``memory_log.py``'s.

Invariants:
    - A log's record (``set_record``) counts in the store's bytes, not in the
      log's own bound.
    - A log holds at most ``max_log_bytes`` bytes of frames (the frame's own
      bytes; a frame larger than the bound is kept alone); older frames go first.
    - All logs together hold at most ``max_store_bytes``: past it the finished
      logs go first, oldest finish first; while only live logs remain, the one
      appending drops its own oldest frames, and ``create`` refuses a new log
      (``StoreFull``) until room is made.
    - A finished log is forgotten ``ttl_s`` seconds after ``finish`` (checked on
      each call, no timer: finished logs expire in the order they finished).
    - ``watch_readers`` tells a log's producer when its first reader comes and
      its last one goes, from ``read`` itself.
    - A log whose producer never finishes stays live: the producer runs in this
      process, and the server finishes every log it creates (``ProducerLost``
      never happens here).
    - A reader of a log deleted while it reads ends with ``CursorEvicted`` (the
      log is gone), as on a shared store; at ``aclose`` readers end cleanly.

Spec: WHATWG HTML, "Server-sent events", "Last-Event-ID".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable, Sequence

from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import CursorEvicted, LogNotFound, StoreFull
from sluicegate.server.stores.event_store import (
    Bound,
    Frames,
    Push,
    StoreCapabilities,
)
from sluicegate.server.stores.memory_log import MemoryLog, ParkedReader, frames_since

__all__ = ["MemoryEventStore", "open_memory_store"]


class MemoryEventStore:
    """Bounded, private logs of resumable streams, in memory (see the module doc).

    Args:
        max_log_bytes: bytes of frames one log keeps (>= 1).
        max_store_bytes: bytes of frames all logs keep together (>= 1).
        ttl_s: seconds a finished log is kept (> 0).
        clock: monotonic seconds; injectable for tests.

    Raises:
        ValueError: a bound out of range.
    """

    def __init__(
        self,
        max_log_bytes: int = 1 << 20,
        max_store_bytes: int = 256 << 20,
        ttl_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_log_bytes < 1 or max_store_bytes < 1 or ttl_s <= 0:
            raise ValueError(
                "expected max_log_bytes >= 1, max_store_bytes >= 1 and ttl_s > 0, "
                f"got {max_log_bytes!r}, {max_store_bytes!r} and {ttl_s!r}"
            )
        self.max_log_bytes = max_log_bytes
        self.max_store_bytes = max_store_bytes
        self.ttl_s = ttl_s
        self._clock = clock
        self._logs: dict[str, MemoryLog] = {}
        self._closed = False  # aclose() ran: readers end cleanly
        self._finished: OrderedDict[str, None] = OrderedDict()  # by finish time
        self._bound: dict[tuple[str, str], str] = {}  # (owner, key) -> response id
        self.nbytes = 0
        """Bytes of frames kept now, over all logs."""
        self.capabilities = StoreCapabilities(
            eager_append=self,
            push_read=self,
            reader_watch=self,
            kept_bytes=lambda: self.nbytes,
        )
        """All but ``remote_cancel``: one process sees every reader and producer."""

    def __len__(self) -> int:
        """Logs kept now (live and finished, expired ones not yet swept)."""
        return len(self._logs)

    async def create(
        self, response_id: str, owner: str, idempotency: Bound | None = None
    ) -> Bound | None:
        """See ``EventStore.create``."""
        self._sweep()
        if idempotency is not None:
            bound = self._bound.get((owner, idempotency[0]))
            if bound is not None:
                log = self._logs[bound]
                assert log.idempotency is not None
                return bound, log.idempotency[1]
        if self.nbytes >= self.max_store_bytes:
            self._evict_finished(self.nbytes - self.max_store_bytes + 1)
            if self.nbytes >= self.max_store_bytes:
                raise StoreFull(
                    f"the resumable-stream store holds {self.nbytes} bytes of live "
                    f"logs; its bound is {self.max_store_bytes}"
                )
        self._logs[response_id] = MemoryLog(owner, idempotency)
        if idempotency is not None:
            self._bound[owner, idempotency[0]] = response_id
        return None

    async def append(self, response_id: str, frames: Sequence[bytes]) -> None:
        """See ``EventStore.append``; a log that is gone (evicted) or finished
        takes nothing."""
        self.append_nowait(response_id, frames)

    def append_nowait(self, response_id: str, frames: Sequence[bytes]) -> None:
        """``append`` without a coroutine: the producer calls it from the
        engine's callback (``SyncAppend``)."""
        log = self._logs.get(response_id)
        if log is None:
            return
        kept = log.live
        if kept is None:  # finished: its last frame was appended
            return
        if len(frames) == 1:  # once per token: kept flat
            frame = frames[0]
            kept.append(frame)
            added = len(frame)
            log.nbytes += added
            self.nbytes += added
            parked = log.parked
            if len(parked) == 1:  # one reader waits, the usual case: ``push``
                reader = parked[0]
                seq = log.first_seq + len(kept) - 1
                if reader.waiter.done():
                    log.parked = []
                elif reader.after == seq - 1 and reader.push([(seq, frame)]):
                    reader.after = seq
                else:
                    reader.waiter.set_result(None)
                    log.parked = []
            elif parked:
                log.push(log.first_seq + len(kept) - 1, frames)
        else:
            kept.extend(frames)
            added = sum(map(len, frames))
            log.nbytes += added
            self.nbytes += added
            if log.parked and frames:
                log.push(log.first_seq + len(kept) - len(frames), frames)
        if log.nbytes > self.max_log_bytes:
            self._trim(log, log.nbytes - self.max_log_bytes)
        if self.nbytes > self.max_store_bytes:
            over = self.nbytes - self.max_store_bytes
            over -= self._evict_finished(over)
            if over > 0:
                self._trim(log, over)
        if log.waiters:
            log.wake()

    async def lease(self, response_id: str) -> None:
        """See ``EventStore.lease``: nothing to do in one process."""

    async def finish(self, response_id: str) -> None:
        """See ``EventStore.finish``; a second call changes nothing."""
        log = self._logs.get(response_id)
        if log is None or log.finished_at is not None:
            return
        log.finished_at = self._clock()
        if log.live is not None:
            log.frames, log.live = tuple(log.live), None
        self._finished[response_id] = None
        log.wake()

    async def attached(self, response_id: str) -> bool:
        """See ``EventStore.attached``."""
        log = self._logs.get(response_id)
        return log is not None and log.readers > 0

    def watch_readers(
        self, response_id: str, watcher: Callable[[bool], None] | None
    ) -> bool:
        """See ``ReaderWatch.watch_readers``: called as ``read`` starts and ends."""
        log = self._logs.get(response_id)
        if log is None:
            return False
        log.watcher = watcher
        return log.readers > 0

    async def resumed(self, response_id: str) -> int:
        """See ``EventStore.resumed``."""
        log = self._logs.get(response_id)
        return 0 if log is None else max(0, log.reads - 1)

    def read(
        self, response_id: str, owner: str, after: int
    ) -> AsyncGenerator[Frames, None]:
        """See ``EventStore.read``. A cursor past the last frame reads only the
        frames appended after it (a finished log's read ends at once)."""
        return self._read(response_id, owner, after, None)

    def read_pushed(
        self, response_id: str, owner: str, after: int, push: Push
    ) -> AsyncGenerator[Frames, None]:
        """See ``PushRead.read_pushed``: ``push`` is called from
        ``append_nowait`` (the engine's callback)."""
        return self._read(response_id, owner, after, push)

    async def _read(
        self, response_id: str, owner: str, after: int, push: Push | None
    ) -> AsyncGenerator[Frames, None]:
        self._sweep()
        log = self._logs.get(response_id)
        if log is None or log.owner != owner:
            raise LogNotFound(f"no resumable stream {response_id!r}")
        if after + 1 < log.first_seq:
            raise CursorEvicted(
                f"frame {after + 1} of {response_id!r} was dropped; the oldest kept "
                f"is {log.first_seq}"
            )
        loop = asyncio.get_running_loop()
        log.readers += 1
        log.reads += 1
        if log.readers == 1 and log.watcher is not None:
            log.watcher(True)
        try:
            batch = frames_since(log, after)
            if batch:
                after = batch[-1][0]
            elif log.finished_at is not None:
                return  # past the end of a finished log: no batch at all
            yield batch  # the first batch, at once: the checks passed
            while True:
                if after + 1 < log.first_seq:  # trimmed while this reader lagged
                    raise CursorEvicted(
                        f"frame {after + 1} of {response_id!r} was dropped while "
                        "it was read"
                    )
                batch = frames_since(log, after)
                if batch:
                    after = batch[-1][0]
                    yield batch
                    continue
                if log.finished_at is not None or self._closed:
                    return
                if self._logs.get(response_id) is not log:
                    raise CursorEvicted(
                        f"{response_id!r} was deleted while it was read"
                    )
                waiter = loop.create_future()
                if push is None:
                    log.waiters.append(waiter)
                    await waiter
                    continue
                parked = ParkedReader(push, after, waiter)
                log.parked.append(parked)
                try:
                    await waiter
                finally:
                    with contextlib.suppress(ValueError):  # woken: out already
                        log.parked.remove(parked)
                    after = parked.after
        finally:
            log.readers -= 1
            if not log.readers and log.watcher is not None:
                log.watcher(False)

    async def set_record(self, response_id: str, record: bytes) -> None:
        """See ``EventStore.set_record``; the record counts in the store's bytes
        (not in the log's own bound: it never pushes frames out)."""
        log = self._logs.get(response_id)
        if log is None:
            return
        self.nbytes += len(record) - len(log.record)
        log.record = record

    async def record(self, response_id: str, owner: str) -> bytes | None:
        """See ``EventStore.record``."""
        self._sweep()
        log = self._logs.get(response_id)
        if log is None or log.owner != owner or not log.record:
            return None
        return log.record

    async def delete(self, response_id: str, owner: str) -> bool:
        """See ``EventStore.delete``."""
        self._sweep()
        log = self._logs.get(response_id)
        if log is None or log.owner != owner:
            return False
        self._finished.pop(response_id, None)
        self._forget(response_id)
        return True

    async def aclose(self) -> None:
        """Forget every log; readers waiting on one end."""
        logs, self._logs = self._logs, {}
        self._closed = True
        self._finished.clear()
        self._bound.clear()
        self.nbytes = 0
        for log in logs.values():
            log.wake()

    def _trim(self, log: MemoryLog, nbytes: int) -> None:
        """Drop ``log``'s oldest frames until ``nbytes`` are gone (its last frame
        stays)."""
        frames = log.live
        assert frames is not None, "only a log appended to is trimmed"
        dropped = 0
        while dropped < nbytes and len(frames) > 1:
            dropped += len(frames.popleft())
            log.first_seq += 1
        log.nbytes -= dropped
        self.nbytes -= dropped

    def _evict_finished(self, nbytes: int) -> int:
        """Forget finished logs, oldest finish first, until ``nbytes`` are freed;
        returns the bytes freed."""
        freed = 0
        while freed < nbytes and self._finished:
            response_id, _ = self._finished.popitem(last=False)
            freed += self._forget(response_id)
        return freed

    def _sweep(self) -> None:
        """Forget the finished logs whose TTL ran out."""
        finished = self._finished
        if not finished:
            return
        expired_at = self._clock() - self.ttl_s
        logs = self._logs
        while finished:
            response_id = next(iter(finished))
            finished_at = logs[response_id].finished_at
            assert finished_at is not None
            if finished_at > expired_at:
                return
            del finished[response_id]
            self._forget(response_id)

    def _forget(self, response_id: str) -> int:
        log = self._logs.pop(response_id)
        if log.idempotency is not None:
            self._bound.pop((log.owner, log.idempotency[0]), None)
        freed = log.nbytes + len(log.record)
        self.nbytes -= freed
        log.wake()
        return freed


def open_memory_store(config: ServerConfig) -> MemoryEventStore:
    """The store of ``config``'s resumable streams: in this process's memory,
    bounded by ``max_log_bytes``, ``max_store_bytes`` and ``resume_ttl_s``."""
    return MemoryEventStore(
        config.max_log_bytes, config.max_store_bytes, config.resume_ttl_s
    )
