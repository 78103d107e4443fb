"""RedisEventStore on a real Redis: what only the Redis store does (leases, one
flush for many logs, Redis going away, the live tail's catch-up, cancels between
replicas). The EventStore contract it shares with the memory store is
``tests/server/test_event_stores.py``'s.

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
    ProducerLost,
    RedisUnavailable,
)
from sluicegate.server.redis import store as redis_store
from sluicegate.server.redis.cancel import RETRY_S, CancelChannel
from sluicegate.server.redis.client import connect
from sluicegate.server.redis.store import RedisEventStore
from sluicegate.testing import free_port
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
