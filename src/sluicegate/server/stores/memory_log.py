"""One log of the memory event store: its frames, and the readers waiting on it.

A ``MemoryLog`` keeps its frames in a deque while it is appended to and in a
tuple once finished (the garbage collector does not walk a tuple of bytes);
each waiting reader has a future of its own, and a pushing reader
(``ParkedReader``) is handed each append's frames until it refuses a batch.
``frames_since`` reads the kept frames after a cursor.
``event_store_memory.MemoryEventStore`` keeps the logs and their bounds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sluicegate.server.stores.event_store import Push

__all__ = ["MemoryLog", "ParkedReader", "frames_since"]


@dataclass(eq=False, slots=True)
class ParkedReader:
    """A pushing reader waiting for frames: ``after`` is the last seq it has."""

    push: Push
    after: int
    waiter: asyncio.Future[None]


@dataclass(eq=False, slots=True)
class MemoryLog:
    """One log of ``MemoryEventStore``: its frames, its readers and waiters."""

    owner: str
    idempotency: tuple[str, str] | None  # (key, body_hash)
    # The kept frames: ``live`` while the log is appended to, then a tuple
    # (``finish``), which the garbage collector stops walking (a tuple of bytes
    # is untracked): a full collection costs nothing per kept frame.
    live: deque[bytes] | None = field(default_factory=deque)
    frames: Sequence[bytes] = ()
    first_seq: int = 0  # the sequence number of frames[0]
    nbytes: int = 0
    finished_at: float | None = None
    readers: int = 0
    reads: int = 0
    record: bytes = b""
    # One future per waiting reader: a shared one would be cancelled for all
    # when one reader's task is cancelled while it waits.
    waiters: list[asyncio.Future[None]] = field(default_factory=list)
    parked: list[ParkedReader] = field(default_factory=list)
    # The producer's ``watch_readers`` callback (True: first reader came).
    watcher: Callable[[bool], None] | None = None

    def __post_init__(self) -> None:
        assert self.live is not None
        self.frames = self.live

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        if self.parked:
            parked, self.parked = self.parked, []
            for reader in parked:
                if not reader.waiter.done():
                    reader.waiter.set_result(None)

    def push(self, first_seq: int, frames: Sequence[bytes]) -> None:
        """Offer frames ``first_seq, ...`` (just appended) to the parked readers;
        wake each one that refuses them, or that misses frames before them. A
        reader whose wait already ended (its task cancelled: its client left)
        is dropped, not pushed to. (One frame to one reader, once per token, is
        ``MemoryEventStore.append_nowait``'s own.)"""
        batch = list(enumerate(frames, first_seq))
        last = first_seq + len(frames) - 1
        kept: list[ParkedReader] = []
        for reader in self.parked:
            if reader.waiter.done():  # woken, or its task cancelled: it reads
                continue
            if reader.after == first_seq - 1 and reader.push(batch):
                reader.after = last
                kept.append(reader)
            else:
                reader.waiter.set_result(None)
        self.parked = kept


_FEW = 8  # frames a reader's batch takes by index


def frames_since(log: MemoryLog, after: int) -> list[tuple[int, bytes]]:
    """The kept frames numbered after ``after``, with their numbers."""
    start = max(after + 1, log.first_seq)
    frames = log.frames
    offset = start - log.first_seq
    if offset >= len(frames):
        return []
    if offset == 0:
        return list(enumerate(frames, start))
    # A live reader asks for the last frame or few: index them from the right
    # (a deque indexes from its nearer end; islice would walk from the left).
    if len(frames) - offset <= _FEW:
        return [(start + i, frames[offset + i]) for i in range(len(frames) - offset)]
    return list(enumerate(itertools.islice(frames, offset, None), start))
