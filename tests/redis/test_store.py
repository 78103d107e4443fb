"""RedisEventStore against the EventStore contract, on a real Redis.

Two stores on two clients stand for two replicas: what one writes, the other reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from sluicegate.engines.clocks import ManualClock, Timer
from sluicegate.server.http.errors import (
    CursorEvicted,
    LogNotFound,
    ProducerLost,
    RedisUnavailable,
    StoreFull,
)
from sluicegate.server.redis import store as redis_store
from sluicegate.server.redis.cancel import RETRY_S, CancelChannel
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.store import RedisEventStore
from sluicegate.testing import free_port
from tests.pushed_reads import pushed_read
from tests.redis_server import RedisServer

pytestmark = pytest.mark.anyio

Stores = Callable[..., RedisEventStore]


@pytest.fixture
async def stores(redis_url: str) -> AsyncIterator[Stores]:
    """``stores(**options)``: a new store on its own client (a replica)."""
    made: list[tuple[RedisEventStore, Any]] = []

    def make(**options: Any) -> RedisEventStore:
        client = connect(redis_url)
        store = RedisEventStore(client, **options)
        made.append((store, client))
        return store

    yield make
    for store, client in made:
        await store.aclose()
        await client.aclose()


def frames(*texts: str) -> list[bytes]:
    return [f"data: {text}\n\n".encode() for text in texts]


async def read_all(store: RedisEventStore, after: int = -1, owner: str = "alice"):
    out: list[tuple[int, bytes]] = []
    with anyio.fail_after(10):
        async for batch in store.read("r1", owner, after):
            out += batch
    return out


async def test_another_replica_replays_every_frame_once_in_order(stores):
    producer, reader = stores(), stores()
    await producer.create("r1", "alice")
    await producer.append("r1", frames("a", "b"))
    await producer.append("r1", frames("c"))
    await producer.finish("r1")
    await reader.lease("r1")  # not its log, and finished: changes nothing
    assert await read_all(reader) == list(enumerate(frames("a", "b", "c")))
    assert await read_all(reader, after=1) == [(2, frames("c")[0])]
    assert await read_all(reader, after=2) == []
    assert await reader.resumed("r1") == 2


async def test_a_reader_follows_the_live_tail_to_the_end(stores):
    producer, reader = stores(), stores()
    await producer.create("r1", "alice")
    await producer.append("r1", frames("a"))
    seen: list[tuple[int, bytes]] = []
    batches = reader.read("r1", "alice", -1)
    with anyio.fail_after(10):
        seen += await anext(batches)
        assert seen == [(0, frames("a")[0])]
        assert await producer.attached("r1")
        next_batch = asyncio.ensure_future(anext(batches))
        await producer.append("r1", frames("b", "c"))
        seen += await next_batch
        await producer.finish("r1")
        async for batch in batches:
            seen += batch
    assert seen == list(enumerate(frames("a", "b", "c")))


@pytest.mark.parametrize("same_replica", [True, False])
async def test_concurrent_appends_reach_a_live_reader_once_in_order(
    stores, same_replica
):
    producer = stores()
    reader = producer if same_replica else stores()
    await producer.create("r1", "alice")
    sent = frames(*(str(i) for i in range(200)))
    seen: list[tuple[int, bytes]] = []

    async def follow() -> None:
        async for batch in reader.read("r1", "alice", -1):
            seen.extend(batch)

    async def produce() -> None:
        for i in range(0, 200, 10):
            await producer.append("r1", sent[i : i + 5])
            await producer.append("r1", sent[i + 5 : i + 10])
            await asyncio.sleep(0)
        await producer.finish("r1")

    with anyio.fail_after(20):
        await asyncio.gather(follow(), produce())
    assert seen == list(enumerate(sent))


async def test_a_cursor_before_the_kept_frames_is_evicted(stores):
    producer, reader = stores(max_log_bytes=40), stores()
    await producer.create("r1", "alice")
    await producer.append("r1", frames("0" * 10, "1" * 10, "2" * 10))
    await producer.finish("r1")
    with pytest.raises(CursorEvicted):
        await read_all(reader)
    kept = await read_all(reader, after=1)
    assert kept == [(2, frames("2" * 10)[0])]  # 18 bytes each: one fits in 40


async def test_a_frame_larger_than_the_bound_is_kept_alone(stores):
    producer, reader = stores(max_log_bytes=8), stores()
    await producer.create("r1", "alice")
    await producer.append("r1", frames("long one", "longer one"))
    await producer.finish("r1")
    assert await read_all(reader, after=0) == [(1, frames("longer one")[0])]


async def test_another_owner_and_an_unknown_id_get_the_same_not_found(stores):
    producer = stores()
    await producer.create("r1", "alice")
    for owner, response_id in [("mallory", "r1"), ("alice", "r2")]:
        with pytest.raises(LogNotFound):
            await anext(producer.read(response_id, owner, -1))


async def test_a_finished_log_is_forgotten_after_its_ttl(stores):
    producer = stores(ttl_s=0.2)
    await producer.create("r1", "alice")
    await producer.append("r1", frames("a"))
    await producer.finish("r1")
    with anyio.fail_after(10):
        while True:
            try:
                await read_all(producer)
            except LogNotFound:
                break
            await anyio.sleep(0.05)


async def test_a_reader_gets_producer_lost_after_the_kept_frames(stores):
    producer, reader = stores(lease_s=0.3), stores(lease_s=0.3)
    await producer.create("r1", "alice")
    await producer.append("r1", frames("a", "b"))
    await producer.aclose()  # the producer's replica stops leasing, unfinished
    seen: list[tuple[int, bytes]] = []

    async def drain() -> None:
        async for batch in reader.read("r1", "alice", 0):
            seen.extend(batch)

    with pytest.raises(ProducerLost), anyio.fail_after(10):
        await drain()
    assert seen == [(1, frames("b")[0])]


async def test_attached_counts_readers_on_any_replica(stores):
    producer, reader = stores(), stores()
    await producer.create("r1", "alice")
    assert not await producer.attached("r1")
    batches = reader.read("r1", "alice", -1)
    await anext(batches)
    assert await producer.attached("r1")
    await batches.aclose()
    for _ in range(1000):  # the reader's lease is dropped in the background
        if not await producer.attached("r1"):
            break
        await anyio.sleep(0.01)
    assert not await producer.attached("r1")


async def test_an_idempotency_key_binds_its_owner_to_one_log(stores):
    store = stores()
    assert await store.create("r1", "alice", ("k", "h1")) is None
    assert await store.create("r2", "alice", ("k", "h2")) == ("r1", "h1")
    assert await store.create("r3", "bob", ("k", "h3")) is None


async def test_live_logs_fill_the_store_then_finished_ones_make_room(stores):
    store = stores(max_log_bytes=100, max_store_bytes=50)
    await store.create("r1", "alice")
    await store.append("r1", frames("x" * 40))  # 48 bytes
    await store.create("r2", "alice")
    await store.append("r2", frames("y"))  # past the bound: r2 keeps its last frame
    await store.flush()  # of both appends
    with pytest.raises(StoreFull):
        await store.create("r3", "alice")
    await store.finish("r1")
    await store.create("r3", "alice")  # r1 evicted, oldest finished first
    with pytest.raises(LogNotFound):
        await anext(store.read("r1", "alice", -1))


async def test_appends_of_many_streams_share_one_round_trip(stores):
    store = stores()
    ids = [f"s{i}" for i in range(100)]
    for response_id in ids:
        await store.create(response_id, "alice")
    before = store.flushes
    appends = [store.append(i, frames("t")) for i in ids]
    await asyncio.gather(*appends, store.flush())
    assert store.flushes - before == 1
    batches = store.read("s99", "alice", -1)
    assert await anext(batches) == [(0, frames("t")[0])]
    await batches.aclose()


async def test_redis_down_is_a_store_error_on_every_call():
    client = connect(f"redis://127.0.0.1:{free_port()}/0")
    store = RedisEventStore(client)
    with pytest.raises(RedisUnavailable):
        await store.create("r1", "alice")
    await store.append("r1", frames("a"))  # queued
    with pytest.raises(RedisUnavailable):
        await store.flush()  # the flush that carried the frame failed
    with pytest.raises(RedisUnavailable):
        await store.append("r1", frames("b"))  # the log is broken
    with pytest.raises(RedisUnavailable):
        await anext(store.read("r1", "alice", -1))
    with pytest.raises(RedisUnavailable):
        await store.attached("r1")
    await store.aclose()
    await client.aclose()


async def test_a_lagging_reader_of_another_replica_gets_cursor_evicted(stores):
    producer, reader = stores(max_log_bytes=40), stores()
    await producer.create("r1", "alice")
    await producer.append("r1", frames("a"))
    await producer.flush()
    batches = reader.read("r1", "alice", -1)
    assert await anext(batches) == [(0, frames("a")[0])]
    await producer.append("r1", frames(*"bcdefgh"))  # trims past the reader
    await producer.flush()
    with pytest.raises(CursorEvicted), anyio.fail_after(10):
        await anext(batches)


async def test_a_followed_log_that_vanishes_ends_its_reader_with_cursor_evicted(
    stores, redis_server
):
    producer, reader = stores(lease_s=0.3), stores(lease_s=0.3)
    await producer.create("r1", "alice")
    batches = reader.read("r1", "alice", -1)
    assert await anext(batches) == []
    redis_server.command(b"FLUSHALL")  # as when Redis drops the log's keys
    with pytest.raises(CursorEvicted), anyio.fail_after(10):
        await anext(batches)


async def test_frames_flushed_while_a_local_reader_joins_are_caught_up(
    stores, monkeypatch
):
    store = stores()
    await store.create("r1", "alice")
    await store.append("r1", frames("a", "b"))
    await store.flush()

    async def missed_replay(client, log, response_id, after):  # flushed after it
        return [], False, False

    monkeypatch.setattr(redis_store, "read_page", missed_replay)
    batches = store.read("r1", "alice", -1)
    assert await anext(batches) == []
    assert await store.attached("r1")  # known here, without asking Redis
    with anyio.fail_after(10):
        assert await anext(batches) == list(enumerate(frames("a", "b")))
        await store.append("r1", frames("c"))
        assert await anext(batches) == [(2, frames("c")[0])]
        await store.finish("r1")
        assert [batch async for batch in batches] == []


def test_bounds_out_of_range_are_refused():
    with pytest.raises(ValueError, match="max_log_bytes"):
        RedisEventStore(None, max_log_bytes=0)  # type: ignore[arg-type]


async def test_append_nowait_queues_for_the_same_flush(stores):
    store = stores()
    await store.create("r1", "alice")
    store.append_nowait("r1", frames("a"))
    await store.append("r1", frames("b"))
    await store.finish("r1")
    assert await read_all(store) == list(enumerate(frames("a", "b")))


async def test_redis_going_away_ends_readers_and_breaks_the_log(tmp_path):
    server = RedisServer(tmp_path)
    server.start()
    clients = [connect(server.url), connect(server.url)]
    producer, other = (RedisEventStore(client, lease_s=0.3) for client in clients)
    try:
        await producer.create("r1", "alice")
        await producer.append("r1", frames("a"))
        await producer.flush()
        here, there = producer.read("r1", "alice", -1), other.read("r1", "alice", -1)
        assert await anext(here) == await anext(there) == [(0, frames("a")[0])]
        with anyio.fail_after(10):
            following = asyncio.ensure_future(anext(here))
            await producer.append("r1", frames("b"))
            assert await following == [(1, frames("b")[0])]  # it follows live
            assert await anext(there) == [(1, frames("b")[0])]
            waiting = asyncio.ensure_future(anext(there))
            server.stop()
            await producer.append("r1", frames("c"))  # queued, and fed here at once
            with pytest.raises(RedisUnavailable):
                await producer.flush()
            with pytest.raises(RedisUnavailable):
                await producer.append("r1", frames("d"))  # the log is broken
            assert await anext(here) == [(2, frames("c")[0])]
            with pytest.raises(RedisUnavailable):
                await anext(here)
            with pytest.raises(RedisUnavailable):
                await waiting
    finally:
        server.stop()
        for store in (producer, other):
            await store.aclose()
        for client in clients:
            await client.aclose()


async def test_a_record_is_read_on_another_replica_and_expires_with_its_log(stores):
    producer, reader = stores(ttl_s=0.3), stores(ttl_s=0.3)
    await producer.create("r1", "alice")
    assert await reader.record("r1", "alice") is None
    await producer.set_record("r1", b'{"input":[]}')
    await producer.set_record("r1", b'{"input":[1]}')
    assert await reader.record("r1", "alice") == b'{"input":[1]}'
    assert await reader.record("r1", "mallory") is None
    assert await reader.record("r2", "alice") is None
    await producer.set_record("gone", b"{}")  # a log that is gone takes nothing
    assert await reader.record("gone", "alice") is None
    await producer.append("r1", frames("a"))
    await producer.finish("r1")
    with anyio.fail_after(10):
        while True:
            if await reader.record("r1", "alice") is None:
                break
            await anyio.sleep(0.05)


async def test_delete_on_another_replica_forgets_the_log_and_its_key(stores):
    producer, other = stores(), stores()
    await producer.create("r1", "alice", ("key", "h1"))
    await producer.append("r1", frames("a"))
    await producer.set_record("r1", b"{}")
    await producer.finish("r1")
    assert not await other.delete("r1", "mallory")
    assert await other.delete("r1", "alice")
    assert not await other.delete("r1", "alice")
    with pytest.raises(LogNotFound):
        await read_all(other)
    assert await other.record("r1", "alice") is None
    assert await producer.create("r2", "alice", ("key", "h2")) is None  # key freed


async def test_a_steady_producer_keeps_its_lease_past_lease_s(stores):
    # Frames in every flush: the lease heartbeat rides along with them.
    producer, reader = stores(lease_s=0.3), stores(lease_s=0.3)
    await producer.create("r1", "alice")

    async def produce() -> None:
        for i in range(60):  # 1.2 s: four leases long
            await producer.append("r1", frames(str(i)))
            await anyio.sleep(0.02)
        await producer.finish("r1")

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(produce)
        got = await read_all(reader)
    assert [seq for seq, _ in got] == list(range(60))


async def test_a_cancel_published_on_one_replica_reaches_the_others(stores):
    producer, other = stores(), stores()
    heard: list[str] = []
    got = anyio.Event()

    def hear(response_id: str) -> None:
        heard.append(response_id)
        got.set()

    producer.on_cancel(hear)
    assert not await other.request_cancel("r0")  # nobody listens yet
    await producer.create("r1", "alice")  # a producing replica listens
    with anyio.fail_after(10):
        while True:  # until its subscription is in place
            if await other.request_cancel("r1"):
                break
            await anyio.sleep(0.02)
        await got.wait()
    assert heard[0] == "r1"


@pytest.mark.parametrize("replicas", ["same", "two"])
@pytest.mark.parametrize("takes", [[], [True, False, False, True]])
async def test_a_pushing_reader_gets_every_frame_once_pushed_or_yielded(
    stores, replicas, takes
):
    producer = stores()
    reader = producer if replicas == "same" else stores()
    got, count = await pushed_read(producer, reader, [1, 2, 1, 3, 1], takes, 0.05)
    got.check(count)
    assert got.pushes >= 1  # the waiting reader was pushed to


async def test_a_reader_pushed_to_as_fast_as_frames_come_gets_each_once(stores):
    store = stores()
    got, count = await pushed_read(store, store, [1] * 50, [False, True] * 25, None)
    got.check(count)


async def xrange_calls(redis_url: str) -> int:
    client = connect(redis_url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_xrange", {}).get("calls", 0))


async def test_the_first_reader_of_a_new_local_log_reads_nothing_back(
    stores, redis_url
):
    store = stores()
    await store.create("r1", "alice")
    before = await xrange_calls(redis_url)
    batches = store.read("r1", "alice", -1)
    with anyio.fail_after(10):
        assert await anext(batches) == []
        await store.append("r1", frames("a", "b"))
        await store.flush()
        await store.append("r1", frames("c"))
        await store.finish("r1")
        rest = [pair async for batch in batches for pair in batch]
    assert rest == list(enumerate(frames("a", "b", "c")))
    assert await xrange_calls(redis_url) == before  # no replay, no catch-up
    # A later reader of the same log replays it from Redis.
    assert await read_all(store) == list(enumerate(frames("a", "b", "c")))


class _Armed(ManualClock):
    """A ``ManualClock`` that says when a timer is set on it."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = asyncio.Event()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        self.armed.set()
        return super().call_at(when, callback)

    async def next_timer(self) -> float:
        """When the next timer set on it is due (waits for one)."""
        with anyio.fail_after(10):
            await self.armed.wait()
        self.armed.clear()
        return self.next_due


async def test_the_cancel_listener_retries_on_its_clock_while_redis_is_away() -> None:
    clock = _Armed()
    client = connect(f"redis://127.0.0.1:{free_port()}/0")  # nothing listens
    channel = CancelChannel(client, "away:")
    channel.timers = clock
    channel.listen(lambda response_id: None)
    try:
        channel.start()
        assert await clock.next_timer() == RETRY_S  # its subscribe was refused
        clock.advance(RETRY_S)  # the next attempt, refused too
        assert await clock.next_timer() == 2 * RETRY_S
    finally:
        await channel.aclose()
        await client.aclose()
