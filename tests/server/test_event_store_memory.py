"""MemoryEventStore: what only the memory store does (its byte count, its
reader watch, expiry by its stepped clock, a finished log the collector skips,
``aclose`` forgetting every log). The EventStore contract it shares with the
Redis store is ``test_event_stores.py``'s."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.server.http.errors import CursorEvicted, LogNotFound, StoreFull
from sluicegate.server.stores.event_store import EventStore, Frames, ReaderWatch
from sluicegate.server.stores.memory_store import MemoryEventStore
from tests.pushed_reads import pushed_read

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def frame(i: int, size: int = 10) -> bytes:
    return f"{i:0{size}d}".encode()


async def take(batches: AsyncIterator[Frames]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    async for batch in batches:
        out += batch
    return out


def test_is_an_event_store() -> None:
    store: EventStore = MemoryEventStore()  # mypy checks the protocol here
    assert isinstance(store, MemoryEventStore)
    assert len(store) == 0


async def test_a_finished_log_takes_no_frame_and_costs_a_collection_nothing() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [frame(0), frame(1)])
    await store.finish("r")
    await store.append("r", [frame(2)])  # after its end: not kept
    assert await take(store.read("r", "k", -1)) == [(0, frame(0)), (1, frame(1))]
    assert store.nbytes == 20
    gc.collect()
    assert not gc.is_tracked(store._logs["r"].frames)  # nothing to walk


async def test_the_watcher_hears_of_the_first_reader_and_of_the_last() -> None:
    store = MemoryEventStore()
    watch: ReaderWatch = store  # mypy checks the protocol here
    await store.create("r", "k")
    heard: list[bool] = []
    assert not watch.watch_readers("r", heard.append)
    assert not watch.watch_readers("gone", heard.append)
    first, second = store.read("r", "k", -1), store.read("r", "k", -1)
    assert await anext(first) == []
    assert await anext(second) == []  # a second reader: no call
    assert heard == [True]
    assert store.watch_readers("r", heard.append)
    await first.aclose()
    assert heard == [True]  # one reader is still there
    await second.aclose()
    assert heard == [True, False]
    third = store.read("r", "k", -1)
    assert await anext(third) == []
    assert heard == [True, False, True]
    await store.delete("r", "k")  # the log is forgotten while read
    with pytest.raises(CursorEvicted):
        await anext(third)
    assert heard == [True, False, True, False]
    await store.create("s", "k")
    store.watch_readers("s", heard.append)
    store.watch_readers("s", None)  # no more calls
    fourth = store.read("s", "k", -1)
    assert await anext(fourth) == []
    await fourth.aclose()
    assert heard == [True, False, True, False]


async def test_finished_logs_expire_in_the_order_they_finished() -> None:
    clock = Clock()
    store = MemoryEventStore(ttl_s=10, clock=clock)
    await store.create("old", "k")
    await store.finish("old")
    clock.now += 5
    await store.create("new", "k")
    await store.finish("new")
    clock.now += 6  # "old" is 11 s old, "new" 6 s
    with pytest.raises(LogNotFound):
        await anext(store.read("old", "k", -1))
    assert await take(store.read("new", "k", -1)) == []
    clock.now += 5
    with pytest.raises(LogNotFound):
        await anext(store.read("new", "k", -1))
    assert len(store) == 0


async def test_nbytes_counts_the_frames_and_records_kept() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [frame(0), frame(1)])
    await store.append("r", [frame(2)])
    assert store.nbytes == 30
    store = MemoryEventStore(max_log_bytes=25)
    await store.create("r", "k")
    await store.append("r", [frame(i) for i in range(5)])  # frames 3 and 4 kept
    assert store.nbytes == 20
    await store.set_record("r", b'{"input":[]}')
    await store.set_record("r", b'{"input":[1]}')  # replaced, counted once
    assert store.nbytes == 20 + len(b'{"input":[1]}')
    await store.append("gone", [frame(0)])  # a forgotten log takes nothing
    await store.finish("gone")
    await store.set_record("gone", b"{}")
    assert store.nbytes == 20 + len(b'{"input":[1]}')
    assert await store.delete("r", "k")
    assert store.nbytes == 0
    assert len(store) == 0


async def test_a_full_store_counts_what_eviction_and_trimming_freed() -> None:
    store = MemoryEventStore(max_log_bytes=30, max_store_bytes=40)
    await store.create("a", "k")
    await store.append("a", [frame(0), frame(1)])
    await store.finish("a")
    await store.create("b", "k")
    await store.append("b", [frame(0), frame(1), frame(2)])  # 50 bytes: a goes
    assert store.nbytes == 30
    await store.append("b", [frame(3)])  # only live logs: b trims itself
    assert store.nbytes == 30
    await store.create("c", "k")
    await store.append("c", [frame(0)])  # 40 bytes: full of live logs
    with pytest.raises(StoreFull):
        await store.create("d", "k")
    await store.finish("c")
    await store.create("d", "k")  # c is finished: it makes room
    assert len(store) == 2


async def test_a_record_expires_with_its_log_and_frees_its_bytes() -> None:
    clock = Clock()
    store = MemoryEventStore(ttl_s=10, clock=clock)
    await store.create("r", "alice", ("key", "h"))
    await store.append("r", [frame(0)])
    await store.set_record("r", b"{}")
    await store.finish("r")
    clock.now += 11
    assert await store.record("r", "alice") is None
    assert store.nbytes == 0


async def test_aclose_forgets_every_log_and_idempotency_key() -> None:
    store = MemoryEventStore()
    assert await store.create("r1", "alice", ("key", "h1")) is None
    await store.finish("r1")
    await store.aclose()
    assert len(store) == 0
    assert await store.create("r4", "alice", ("key", "h4")) is None


@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=12),
    takes=st.lists(st.booleans(), max_size=12),
    settle=st.booleans(),
)
def test_a_pushing_reader_gets_every_frame_once_pushed_or_yielded(
    sizes: list[int], takes: list[bool], settle: bool
) -> None:
    store = MemoryEventStore()
    got, count = asyncio.run(
        pushed_read(store, store, sizes, takes, 0 if settle else None)
    )
    got.check(count)
