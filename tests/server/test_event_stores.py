"""The EventStore contract, run against every store: memory and Redis.

Each test takes ``kind``, one store kind, and makes its stores with
``kind.replicas(**bounds)``: a producer and a reader of the same logs. On Redis
they are two stores on two clients (two replicas: what one writes, the other
reads); in memory they are one store, as a single process has. What a test
asserts is what ``event_store.EventStore`` promises, through its methods only;
what one store alone does (the memory store's byte count and reader watch,
Redis's leases, flushes and outages) is tested beside it
(``test_event_store_memory.py``, ``tests/redis/test_store.py``).

Time: the memory store's clock is stepped; Redis keeps its own, so a Redis test
waits a TTL out (``kind.outlive``), and a reader's lease, dropped in the
background there, is polled for (``kind.eventually``, one look in memory).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from sluicegate.server.http.errors import CursorEvicted, LogNotFound, StoreFull
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.store import RedisEventStore
from sluicegate.server.stores.event_store import EventStore, Frames
from sluicegate.server.stores.memory_store import MemoryEventStore
from tests.pushed_reads import frame as pushed_frame
from tests.pushed_reads import pushed_read

pytestmark = pytest.mark.anyio

TTL_S = 0.2
"""A short TTL: Redis's clock cannot be stepped, so its tests wait it out."""
SIZE = 11
"""Bytes of each ``frame``."""


def frame(i: int) -> bytes:
    """Frame ``i``: ``SIZE`` bytes, a complete SSE event."""
    return f"data: {i:03d}\n\n".encode()


def frames(*numbers: int) -> list[bytes]:
    return [frame(i) for i in numbers]


def seqs(*numbers: int) -> list[tuple[int, bytes]]:
    """What a read yields of frames ``numbers`` appended as frames ``numbers``."""
    return [(i, frame(i)) for i in numbers]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Kind:
    """One store kind under the contract (see the module doc)."""

    name: str
    redis_url: str | None = None
    clock: Clock = field(default_factory=Clock)
    made: list[Any] = field(default_factory=list)  # to close: stores, clients

    def store(self, lease_s: float | None = None, **bounds: Any) -> Any:
        """A new store (``MemoryEventStore`` or ``RedisEventStore``; typed
        ``Any`` for the methods one kind alone has, such as ``append_nowait``).
        ``lease_s`` is Redis's alone (a shorter one: its readers learn sooner
        that a log is gone); the memory store has no leases."""
        if self.redis_url is None:
            made: Any = MemoryEventStore(clock=self.clock, **bounds)
            self.made.append(made)
            return made
        client = connect(self.redis_url)
        self.made.append(client)
        if lease_s is not None:
            bounds["lease_s"] = lease_s
        made = RedisEventStore(client, **bounds)
        self.made.append(made)
        return made

    def replicas(self, lease_s: float | None = None, **bounds: Any) -> tuple[Any, Any]:
        """A producer and a reader of the same logs (one store in memory)."""
        producer = self.store(lease_s, **bounds)
        if self.redis_url is None:
            return producer, producer
        return producer, self.store(lease_s, **bounds)

    async def sent(self, store: Any) -> None:
        """Wait until ``store``'s appends so far are where every replica reads
        them (Redis queues them for its next flush)."""
        if self.redis_url is not None:
            await store.flush()

    async def outlive(self, ttl_s: float) -> None:
        """Let ``ttl_s`` pass for the store: step the memory store's clock, wait
        on Redis's (its expiry is in milliseconds: a little more)."""
        if self.redis_url is None:
            self.clock.now += ttl_s
        else:
            await anyio.sleep(ttl_s + 0.05)

    async def eventually(self, check: Callable[[], Awaitable[bool]]) -> bool:
        """Whether ``check()`` holds: at once in memory; on Redis within 10 s
        (what it says is dropped in the background there)."""
        tries = 1 if self.redis_url is None else 1000
        for _ in range(tries):
            if await check():
                return True
            await anyio.sleep(0.01)
        return False

    async def aclose(self) -> None:
        for made in reversed(self.made):  # each store before its client
            await made.aclose()


@pytest.fixture(params=["memory", "redis"])
async def kind(request: pytest.FixtureRequest) -> AsyncIterator[Kind]:
    """Each store kind in turn; Redis is the session's real one, flushed."""
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    made = Kind(request.param, url)
    yield made
    await made.aclose()


async def take(batches: AsyncIterator[Frames]) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    with anyio.fail_after(10):
        async for batch in batches:
            out += batch
    return out


async def read_all(
    store: EventStore, after: int = -1, owner: str = "alice", response_id: str = "r"
) -> list[tuple[int, bytes]]:
    return await take(store.read(response_id, owner, after))


async def test_bounds_out_of_range_are_refused(kind: Kind) -> None:
    with pytest.raises(ValueError, match="max_log_bytes"):
        kind.store(max_log_bytes=0)


async def test_every_kind_is_an_event_store(kind: Kind) -> None:
    store: EventStore = kind.store()  # mypy checks the protocol at each store
    assert not await store.attached("r")


async def test_a_finished_log_replays_from_every_cursor_on_every_replica(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    await producer.append("r", frames(0, 1))
    await producer.append("r", frames(2))
    await producer.finish("r")
    await producer.finish("r")  # twice: nothing changes
    await producer.append("r", frames(3))  # after its end: not kept
    await reader.lease("r")  # not its log, and finished: changes nothing
    for after in range(-1, 5):
        assert await read_all(reader, after) == seqs(*range(after + 1, 3))
    assert await reader.resumed("r") == 5  # reads after the first


async def test_a_reader_follows_the_live_tail_and_ends_with_the_log(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    await producer.append("r", frames(0))
    batches = reader.read("r", "alice", -1)
    with anyio.fail_after(10):
        assert await anext(batches) == seqs(0)
        assert await producer.attached("r")  # a reader on any replica counts
        waiting = asyncio.ensure_future(anext(batches))
        await asyncio.sleep(0)
        assert not waiting.done()
        await producer.append("r", frames(1, 2))
        assert await waiting == seqs(1, 2)
        await producer.finish("r")
        with pytest.raises(StopAsyncIteration):
            await anext(batches)

    async def detached() -> bool:
        return not await producer.attached("r")

    assert await kind.eventually(detached)


async def test_the_first_batch_comes_at_once_even_when_empty(kind: Kind) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    assert not await producer.attached("r")
    batches = reader.read("r", "alice", -1)
    assert await anext(batches) == []
    assert await producer.attached("r")
    await batches.aclose()

    async def detached() -> bool:
        return not await producer.attached("r")

    assert await kind.eventually(detached)


@pytest.mark.parametrize("same_replica", [True, False])
async def test_concurrent_appends_reach_a_live_reader_once_in_order(
    kind: Kind, same_replica: bool
) -> None:
    producer, other = kind.replicas()
    reader = producer if same_replica else other
    await producer.create("r", "alice")
    seen: list[tuple[int, bytes]] = []

    async def follow() -> None:
        async for batch in reader.read("r", "alice", -1):
            seen.extend(batch)

    async def produce() -> None:
        for i in range(0, 200, 10):
            await producer.append("r", frames(*range(i, i + 5)))
            await producer.append("r", frames(*range(i + 5, i + 10)))
            await asyncio.sleep(0)
        await producer.finish("r")

    with anyio.fail_after(20):
        await asyncio.gather(follow(), produce())
    assert seen == seqs(*range(200))


async def test_a_cancelled_reader_leaves_the_other_readers_waiting(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    first, second = reader.read("r", "alice", -1), reader.read("r", "alice", -1)
    assert await anext(first) == await anext(second) == []
    one = asyncio.ensure_future(anext(first))
    two = asyncio.ensure_future(anext(second))
    await asyncio.sleep(0)
    one.cancel()
    await asyncio.sleep(0)
    await producer.append("r", frames(0))
    with anyio.fail_after(10):
        assert await two == seqs(0)
    assert one.cancelled()


async def test_another_owner_and_an_unknown_id_get_the_same_not_found(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    for response_id, owner in (("r", "mallory"), ("x", "alice")):
        with pytest.raises(LogNotFound):
            await anext(reader.read(response_id, owner, -1))
    assert not await reader.attached("x")
    assert await reader.resumed("x") == 0


async def test_a_log_over_its_bound_drops_its_oldest_frames(kind: Kind) -> None:
    producer, reader = kind.replicas(max_log_bytes=2 * SIZE + SIZE // 2)
    await producer.create("r", "alice")
    await producer.append("r", frames(*range(5)))  # frames 3 and 4 kept
    await kind.sent(producer)
    for after in (-1, 1):
        with pytest.raises(CursorEvicted):
            await anext(reader.read("r", "alice", after))
    await producer.finish("r")
    assert await read_all(reader, after=2) == seqs(3, 4)


async def test_a_frame_larger_than_the_bound_is_kept_alone(kind: Kind) -> None:
    producer, reader = kind.replicas(max_log_bytes=SIZE // 2)
    await producer.create("r", "alice")
    await producer.append("r", frames(0, 1))
    await producer.finish("r")
    assert await read_all(reader, after=0) == seqs(1)


async def test_a_reader_that_falls_behind_the_bound_is_told(kind: Kind) -> None:
    producer, reader = kind.replicas(max_log_bytes=2 * SIZE + SIZE // 2)
    await producer.create("r", "alice")
    await producer.append("r", frames(0))
    await kind.sent(producer)
    batches = reader.read("r", "alice", -1)
    assert await anext(batches) == seqs(0)
    await producer.append("r", frames(*range(1, 6)))  # trims past the reader
    await kind.sent(producer)
    with pytest.raises(CursorEvicted), anyio.fail_after(10):
        await anext(batches)


async def test_a_finished_log_its_record_and_its_key_go_after_its_ttl(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas(ttl_s=TTL_S)
    await producer.create("r", "alice", ("key", "h"))
    await producer.append("r", frames(0))
    await producer.set_record("r", b"{}")
    await producer.finish("r")
    assert await read_all(reader) == seqs(0)  # kept ttl_s from its finish
    await kind.outlive(TTL_S)
    with pytest.raises(LogNotFound):
        await anext(reader.read("r", "alice", -1))
    assert await reader.record("r", "alice") is None
    assert await producer.create("r2", "alice", ("key", "h2")) is None  # key freed


async def test_live_logs_fill_the_store_then_finished_ones_make_room(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas(max_log_bytes=3 * SIZE, max_store_bytes=4 * SIZE)
    await producer.create("a", "alice")
    await producer.append("a", frames(0, 1))
    await producer.finish("a")
    await producer.create("b", "alice")
    await producer.append("b", frames(0, 1, 2))  # five frames in the store: a goes
    await kind.sent(producer)
    with pytest.raises(LogNotFound):
        await anext(reader.read("a", "alice", -1))
    await producer.append("b", frames(3))  # only live logs: b trims itself
    await kind.sent(producer)
    with pytest.raises(CursorEvicted):
        await anext(reader.read("b", "alice", -1))
    await producer.create("c", "alice")
    await producer.append("c", frames(0))  # four frames: full of live logs
    await producer.append("c", frames(1))  # no finished log: c trims itself
    await kind.sent(producer)
    with pytest.raises(CursorEvicted):
        await anext(reader.read("c", "alice", -1))
    with pytest.raises(StoreFull):
        await producer.create("d", "alice")
    await producer.finish("c")
    await producer.create("d", "alice")  # c is finished: it makes room
    with pytest.raises(LogNotFound):
        await anext(reader.read("c", "alice", -1))
    await producer.finish("b")
    assert await read_all(reader, 0, response_id="b") == seqs(1, 2, 3)


async def test_an_idempotency_key_binds_its_owner_to_one_log(kind: Kind) -> None:
    producer, other = kind.replicas()
    assert await producer.create("r1", "alice", ("key", "h1")) is None
    assert await other.create("r2", "alice", ("key", "h2")) == ("r1", "h1")
    assert await other.create("r3", "bob", ("key", "h3")) is None  # per owner


async def test_appends_to_an_unknown_log_are_dropped(kind: Kind) -> None:
    producer, reader = kind.replicas()
    await producer.append("gone", frames(0))
    await producer.finish("gone")
    await kind.sent(producer)
    with pytest.raises(LogNotFound):
        await anext(reader.read("gone", "alice", -1))


async def test_append_nowait_is_an_append(kind: Kind) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    producer.append_nowait("r", frames(0))
    await producer.append("r", frames(1))
    await producer.finish("r")
    assert await read_all(reader) == seqs(0, 1)


async def test_aclose_ends_waiting_readers(kind: Kind) -> None:
    producer, reader = kind.replicas()
    await producer.create("r", "alice")
    batches = reader.read("r", "alice", -1)
    assert await anext(batches) == []
    waiting = asyncio.ensure_future(anext(batches))
    await asyncio.sleep(0)
    await reader.aclose()
    with pytest.raises(StopAsyncIteration), anyio.fail_after(10):
        await waiting


async def test_a_record_lives_and_dies_with_its_log_behind_the_owner_check(
    kind: Kind,
) -> None:
    producer, reader = kind.replicas(ttl_s=TTL_S)
    await producer.create("r", "alice")
    assert await reader.record("r", "alice") is None  # none kept yet
    await producer.set_record("r", b'{"input":[]}')
    await producer.set_record("r", b'{"input":[1]}')  # replaced
    assert await reader.record("r", "alice") == b'{"input":[1]}'
    assert await reader.record("r", "mallory") is None
    assert await reader.record("unknown", "alice") is None
    await producer.set_record("gone", b"{}")  # a log that is gone takes nothing
    assert await reader.record("gone", "alice") is None
    await producer.append("r", frames(0))
    await producer.finish("r")
    await kind.outlive(TTL_S)
    assert await reader.record("r", "alice") is None


async def test_delete_forgets_the_owners_log_its_record_and_its_key(
    kind: Kind,
) -> None:
    producer, other = kind.replicas(lease_s=0.3)
    await producer.create("r", "alice", ("key", "h"))
    await producer.append("r", frames(0))
    await producer.set_record("r", b"{}")
    await kind.sent(producer)
    batches = other.read("r", "alice", -1)
    assert await anext(batches) == seqs(0)
    assert not await other.delete("r", "mallory")
    assert await other.delete("r", "alice")
    assert not await other.delete("r", "alice")
    with pytest.raises(CursorEvicted):  # a waiting reader: the log is gone
        await take(batches)
    with pytest.raises(LogNotFound):
        await anext(other.read("r", "alice", -1))
    assert await other.record("r", "alice") is None
    assert await producer.create("r2", "alice", ("key", "h2")) is None  # key freed


@pytest.mark.parametrize("same_replica", [True, False])
@pytest.mark.parametrize("takes", [[], [True, False, False, True]])
async def test_a_pushing_reader_gets_every_frame_once_pushed_or_yielded(
    kind: Kind, same_replica: bool, takes: list[bool]
) -> None:
    producer, other = kind.replicas()
    reader = producer if same_replica else other
    # Between appends the reader waits again: on Redis, across a tail's read.
    settle_s = 0 if kind.redis_url is None else 0.05
    with anyio.fail_after(20):
        got, count = await pushed_read(
            producer, reader, [1, 2, 1, 3, 1], takes, settle_s
        )
    got.check(count)
    assert got.pushes >= 1  # the waiting reader was pushed to


async def test_a_reader_pushed_to_as_fast_as_frames_come_gets_each_once(
    kind: Kind,
) -> None:
    store = kind.store()
    got, count = await pushed_read(store, store, [1] * 50, [False, True] * 25, None)
    got.check(count)


async def test_a_waiting_reader_that_takes_every_push_is_woken_only_by_the_end(
    kind: Kind,
) -> None:
    store = kind.store()
    got, count = await pushed_read(store, store, [1, 2, 1, 3], [], settle_s=0)
    got.check(count)
    assert got.yielded == []  # nothing kept before the first read, all pushed
    assert got.pushes == 4  # one call per append


async def test_a_refused_push_is_yielded_and_the_reader_is_pushed_to_again(
    kind: Kind,
) -> None:
    store = kind.store()
    got, count = await pushed_read(store, store, [1, 1, 1], [True, False], settle_s=0)
    got.check(count)
    assert got.pushed == [(0, pushed_frame(0)), (2, pushed_frame(2))]
    assert got.yielded == [(1, pushed_frame(1))]


async def test_a_reader_whose_wait_was_cancelled_is_not_pushed_to(
    kind: Kind,
) -> None:
    store = kind.store()
    await store.create("r", "alice")
    pushed: list[Frames] = []

    def push(batch: Frames) -> bool:
        pushed.append(batch)
        return True

    batches = store.read_pushed("r", "alice", -1, push)
    assert await anext(batches) == []

    async def next_batch() -> Frames:
        return await anext(batches)

    waiting = asyncio.get_running_loop().create_task(next_batch())
    await asyncio.sleep(0)  # the reader waits
    waiting.cancel()  # its client left ...
    store.append_nowait("r", [frame(0)])  # ... as a frame came
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert pushed == []
