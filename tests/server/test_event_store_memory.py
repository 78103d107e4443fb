"""MemoryEventStore: replay then live, bounds, TTL, owners, idempotency keys."""

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
from tests.pushed_reads import frame as pushed_frame
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


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="max_log_bytes"):
        MemoryEventStore(max_log_bytes=0)


async def test_a_finished_log_replays_from_every_cursor() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [frame(0), frame(1)])
    await store.append("r", [frame(2)])
    await store.finish("r")
    await store.finish("r")  # twice: nothing changes
    for after in range(-1, 4):
        got = await take(store.read("r", "k", after))
        assert got == [(i, frame(i)) for i in range(after + 1, 3)]
    assert await store.resumed("r") == 4
    assert store.nbytes == 30


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


async def test_a_reader_follows_the_live_tail_and_ends_with_the_log() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [frame(0)])
    reader = store.read("r", "k", -1)
    assert await anext(reader) == [(0, frame(0))]
    assert await store.attached("r")
    waiting = asyncio.ensure_future(anext(reader))
    await asyncio.sleep(0)
    assert not waiting.done()
    await store.append("r", [frame(1), frame(2)])
    assert await waiting == [(1, frame(1)), (2, frame(2))]
    await store.finish("r")
    with pytest.raises(StopAsyncIteration):
        await anext(reader)
    assert not await store.attached("r")


async def test_the_first_batch_comes_at_once_even_when_empty() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    reader = store.read("r", "k", -1)
    assert await anext(reader) == []
    await reader.aclose()  # type: ignore[attr-defined]  # an async generator
    assert not await store.attached("r")


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
    await first.aclose()  # type: ignore[attr-defined]  # an async generator
    assert heard == [True]  # one reader is still there
    await second.aclose()  # type: ignore[attr-defined]
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
    await fourth.aclose()  # type: ignore[attr-defined]
    assert heard == [True, False, True, False]


async def test_a_cancelled_reader_leaves_the_other_readers_waiting() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    first, second = store.read("r", "k", -1), store.read("r", "k", -1)
    assert await anext(first) == await anext(second) == []
    one = asyncio.ensure_future(anext(first))
    two = asyncio.ensure_future(anext(second))
    await asyncio.sleep(0)
    one.cancel()
    await asyncio.sleep(0)
    await store.append("r", [frame(0)])
    assert await two == [(0, frame(0))]
    assert one.cancelled()


async def test_another_owner_and_an_unknown_id_are_not_found() -> None:
    store = MemoryEventStore()
    await store.create("r", "alice")
    for response_id, owner in (("r", "bob"), ("x", "alice")):
        with pytest.raises(LogNotFound):
            await anext(store.read(response_id, owner, -1))
    assert not await store.attached("x")
    assert await store.resumed("x") == 0


async def test_a_log_over_its_bound_drops_its_oldest_frames() -> None:
    store = MemoryEventStore(max_log_bytes=25)
    await store.create("r", "k")
    await store.append("r", [frame(i) for i in range(5)])
    assert store.nbytes == 20  # frames 3 and 4 kept
    with pytest.raises(CursorEvicted):
        await anext(store.read("r", "k", 1))
    await store.finish("r")
    assert await take(store.read("r", "k", 2)) == [(3, frame(3)), (4, frame(4))]


async def test_a_frame_larger_than_the_bound_is_kept_alone() -> None:
    store = MemoryEventStore(max_log_bytes=5)
    await store.create("r", "k")
    await store.append("r", [frame(0), frame(1)])
    await store.finish("r")
    assert await take(store.read("r", "k", 0)) == [(1, frame(1))]


async def test_a_reader_that_falls_behind_the_bound_is_told() -> None:
    store = MemoryEventStore(max_log_bytes=25)
    await store.create("r", "k")
    await store.append("r", [frame(0)])
    reader = store.read("r", "k", -1)
    assert await anext(reader) == [(0, frame(0))]
    await store.append("r", [frame(i) for i in range(1, 6)])
    with pytest.raises(CursorEvicted):
        await anext(reader)


async def test_a_finished_log_expires_after_its_ttl() -> None:
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


async def test_a_full_store_evicts_finished_logs_then_refuses() -> None:
    store = MemoryEventStore(max_log_bytes=30, max_store_bytes=40)
    await store.create("a", "k")
    await store.append("a", [frame(0), frame(1)])
    await store.finish("a")
    await store.create("b", "k")
    await store.append("b", [frame(0), frame(1), frame(2)])  # 50 bytes: a goes
    with pytest.raises(LogNotFound):
        await anext(store.read("a", "k", -1))
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


async def test_an_idempotency_key_binds_its_owner_to_one_log() -> None:
    store = MemoryEventStore()
    assert await store.create("r1", "alice", ("key", "h1")) is None
    assert await store.create("r2", "alice", ("key", "h2")) == ("r1", "h1")
    assert await store.create("r3", "bob", ("key", "h3")) is None  # per owner
    await store.finish("r1")
    await store.aclose()
    assert await store.create("r4", "alice", ("key", "h4")) is None


async def test_appends_to_a_forgotten_log_are_dropped() -> None:
    store = MemoryEventStore()
    await store.append("gone", [frame(0)])
    await store.finish("gone")
    assert store.nbytes == 0


async def test_aclose_ends_waiting_readers() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    reader = store.read("r", "k", -1)
    assert await anext(reader) == []
    waiting = asyncio.ensure_future(anext(reader))
    await asyncio.sleep(0)
    await store.aclose()
    with pytest.raises(StopAsyncIteration):
        await waiting


async def test_a_record_lives_and_dies_with_its_log_behind_the_owner_check() -> None:
    clock = Clock()
    store = MemoryEventStore(ttl_s=10, clock=clock)
    await store.create("r", "alice", ("key", "h"))
    await store.append("r", [frame(0)])
    assert await store.record("r", "alice") is None  # none kept yet
    await store.set_record("r", b'{"input":[]}')
    await store.set_record("r", b'{"input":[1]}')  # replaced, counted once
    assert await store.record("r", "alice") == b'{"input":[1]}'
    assert await store.record("r", "bob") is None
    assert await store.record("unknown", "alice") is None
    assert store.nbytes == len(frame(0)) + len(b'{"input":[1]}')
    await store.set_record("gone", b"{}")  # a log that is gone takes nothing
    await store.finish("r")
    clock.now += 11
    assert await store.record("r", "alice") is None
    assert store.nbytes == 0


async def test_delete_forgets_the_owners_log_its_record_and_its_key() -> None:
    store = MemoryEventStore()
    await store.create("r", "alice", ("key", "h"))
    await store.append("r", [frame(0)])
    await store.set_record("r", b"{}")
    reader = store.read("r", "alice", -1)
    assert await anext(reader) == [(0, frame(0))]
    assert not await store.delete("r", "bob")
    assert await store.delete("r", "alice")
    assert not await store.delete("r", "alice")
    with pytest.raises(CursorEvicted):  # a waiting reader: the log is gone
        await take(reader)
    with pytest.raises(LogNotFound):
        await anext(store.read("r", "alice", -1))
    assert await store.record("r", "alice") is None
    assert store.nbytes == 0
    assert len(store) == 0
    assert await store.create("r2", "alice", ("key", "h2")) is None  # key freed


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


async def test_a_waiting_reader_that_takes_every_push_is_woken_only_by_the_end() -> (
    None
):
    store = MemoryEventStore()
    got, count = await pushed_read(store, store, [1, 2, 1, 3], [], settle_s=0)
    got.check(count)
    assert got.yielded == []  # nothing kept before the first read, all pushed
    assert got.pushes == 4  # one call per append


async def test_a_refused_push_is_yielded_and_the_reader_is_pushed_to_again() -> None:
    store = MemoryEventStore()
    got, count = await pushed_read(store, store, [1, 1, 1], [True, False], settle_s=0)
    got.check(count)
    assert got.pushed == [(0, pushed_frame(0)), (2, pushed_frame(2))]
    assert got.yielded == [(1, pushed_frame(1))]


async def test_a_reader_whose_wait_was_cancelled_is_not_pushed_to() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    pushed: list[Frames] = []

    def push(batch: Frames) -> bool:
        pushed.append(batch)
        return True

    batches = store.read_pushed("r", "k", -1, push)
    assert await anext(batches) == []

    async def next_batch() -> Frames:
        return await anext(batches)

    waiting = asyncio.get_running_loop().create_task(next_batch())
    await asyncio.sleep(0)  # the reader waits
    waiting.cancel()  # its client left ...
    store.append_nowait("r", [b"data: 0\n\n"])  # ... as a frame came
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pushed == []
