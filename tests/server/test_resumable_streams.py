"""Resumable streams in the app (ASGI fakes): producers, readers, refusals."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

import anyio
import pytest
from starlette.types import Message

from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import ProducerLost
from sluicegate.server.resumable.log_response import PRODUCER_LOST, LogStreamResponse
from sluicegate.server.resumable.log_writes import BROKEN
from sluicegate.server.stores.event_store import Bound, Frames, StoreCapabilities
from sluicegate.server.stores.memory_store import MemoryEventStore
from sluicegate.server.streaming.shared import StreamLimits

from ..polling import wait_until
from .asgi import CHAT, HELLO, Exchange, exchange, on_clock

pytestmark = pytest.mark.anyio

RESUMABLE = {
    "messages": HELLO,
    "stream": True,
    "stream_options": {
        "include_usage": True,
        "resumable": True,
        "include_obfuscation": False,  # compared byte for byte
    },
}


class TaskOnlyStore:
    """A memory store that declares no capabilities: its producer is fed by its
    task (no ``eager_append``) and asks ``attached`` on a timer."""

    def __init__(self, store: MemoryEventStore, fail_appends: int = 0) -> None:
        self.capabilities = StoreCapabilities()
        self._store = store
        self._fail_appends = fail_appends

    async def create(
        self, response_id: str, owner: str, idempotency: Bound | None = None
    ) -> Bound | None:
        return await self._store.create(response_id, owner, idempotency)

    async def append(self, response_id: str, frames: Sequence[bytes]) -> None:
        if self._fail_appends:
            self._fail_appends -= 1
            raise RuntimeError("the store broke")
        await self._store.append(response_id, frames)

    async def lease(self, response_id: str) -> None:
        await self._store.lease(response_id)

    async def finish(self, response_id: str) -> None:
        await self._store.finish(response_id)

    async def attached(self, response_id: str) -> bool:
        return await self._store.attached(response_id)

    async def resumed(self, response_id: str) -> int:
        return await self._store.resumed(response_id)

    def read(
        self, response_id: str, owner: str, after: int
    ) -> AsyncGenerator[Frames, None]:
        return self._store.read(response_id, owner, after)

    async def aclose(self) -> None:
        await self._store.aclose()


def normalized(body: bytes) -> bytes:
    body = re.sub(rb"(chat)?cmpl-[0-9a-f]{32}", b"ID", body)
    return re.sub(rb'"created":[0-9]+', b'"created":0', body)


async def test_the_task_fed_producer_writes_what_the_eager_one_writes() -> None:
    bodies = []
    for task_only in (False, True):
        app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
        if task_only:
            app.state.resumable.store = TaskOnlyStore(MemoryEventStore())
        ex = await exchange(app, CHAT, {**RESUMABLE, "logprobs": True})
        assert ex.status == 200
        assert ex.completed
        bodies.append(normalized(ex.body))
    assert bodies[0] == bodies[1]
    assert bodies[0].startswith(b"id: ID.0\ndata: ")
    assert bodies[0].endswith(b"data: [DONE]\n\n")


async def test_a_store_failure_ends_the_stream_with_an_internal_error() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    app.state.resumable.store = TaskOnlyStore(MemoryEventStore(), fail_appends=1)
    ex = await exchange(app, CHAT, RESUMABLE)
    assert b'"code":"internal_error"' in ex.body
    assert b"[DONE]" not in ex.body
    await ex.wait_for(lambda: bool(app.state.ledger.rows))
    assert app.state.ledger.rows[0].end_state == "errored"


class EagerFailingStore(MemoryEventStore):
    """A memory store whose first append from the engine's callback fails."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def append_nowait(self, response_id: str, frames: Sequence[bytes]) -> None:
        if not self.failed and len(self) and self.nbytes:
            self.failed = True
            raise RuntimeError("the store broke in the callback")
        super().append_nowait(response_id, frames)


async def test_a_store_failure_in_the_engine_callback_fails_the_stream() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=200), ServerConfig())
    store = app.state.resumable.store = EagerFailingStore()
    ex = await exchange(app, CHAT, RESUMABLE)
    assert store.failed
    assert b'"code":"internal_error"' in ex.body
    assert b"[DONE]" not in ex.body


async def test_a_resumable_server_default_is_overridden_by_the_request() -> None:
    app = create_app(
        ScriptedEngine(tokens_per_s=5000), ServerConfig(resumable_streams=True)
    )
    on = await exchange(app, CHAT, {**RESUMABLE, "stream_options": {}})
    off = await exchange(
        app, CHAT, {**RESUMABLE, "stream_options": {"resumable": False}}
    )
    assert on.body.startswith(b"id: ")
    assert off.body.startswith(b"data: ")


async def test_a_malformed_idempotency_key_is_a_400() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    for key in (b"has space", b"x" * 256):
        ex = Exchange(app, CHAT, RESUMABLE, extra_headers=[(b"idempotency-key", key)])
        with anyio.fail_after(5):
            await ex.run()
        assert ex.status == 400, key
        assert b'"param":"Idempotency-Key"' in ex.body


async def test_a_store_full_of_live_logs_refuses_new_resumable_streams() -> None:
    config = ServerConfig(max_log_bytes=100, max_store_bytes=100)
    app = create_app(ScriptedEngine(tokens_per_s=20), config)
    first = Exchange(app, CHAT, RESUMABLE)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(first.run)
        await first.wait_for(lambda: len(first.body) > 100)
        refused = await exchange(app, CHAT, RESUMABLE)
        plain = Exchange(app, CHAT, {**RESUMABLE, "stream_options": {}})
        tasks.start_soon(plain.run)
        await plain.wait_for(lambda: plain.status is not None)
        first.leave()
        plain.leave()
        await app.state.resumable.aclose()  # the producer ends, its row recorded
    assert refused.status == 503
    assert b'"code":"resume_store_full"' in refused.body
    assert plain.status == 200
    states = sorted(row.end_state for row in app.state.ledger.rows)
    assert states == ["aborted", "aborted", "rejected"]


async def test_an_engine_that_refuses_ends_its_log_with_an_error_event() -> None:
    engine = ScriptedEngine(tokens_per_s=20, max_running=1, max_queued=0)
    app = create_app(engine, ServerConfig())
    busy = Exchange(app, CHAT, {**RESUMABLE, "stream_options": {}})
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(busy.run)
        await busy.wait_for(lambda: busy.status is not None)
        ex = await exchange(app, CHAT, RESUMABLE)
        busy.leave()
    assert ex.status == 503
    store = app.state.resumable.store
    (response_id,) = store._logs  # finished, with one error event
    reader = store.read(response_id, "anonymous", -1)
    tail = [frame async for batch in reader for frame in batch]
    assert len(tail) == 1
    assert b'"code":"not_started"' in tail[0][1]


class Reader:
    """A ``send`` that records the body and may stop accepting bytes."""

    def __init__(self, block_after: int | None = None) -> None:
        self.messages: list[Message] = []
        self._block_after = block_after
        self.gone = anyio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        bodies = sum(m["type"] == "http.response.body" for m in self.messages)
        body = message["type"] == "http.response.body"
        if body and self._block_after is not None and bodies >= self._block_after:
            await anyio.sleep_forever()
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages)

    @property
    def completed(self) -> bool:
        last = self.messages[-1]
        return last["type"] == "http.response.body" and not last["more_body"]


async def reader_of(
    store: Any,
    after: int = -1,
    limits: StreamLimits | None = None,
    *,
    pushed: bool = False,
) -> LogStreamResponse:
    limits = limits or StreamLimits()
    return await LogStreamResponse.open(store, "r", "k", after, limits, pushed=pushed)


PUSHED = pytest.mark.parametrize("pushed", [False, True], ids=["task", "pushed"])


@PUSHED
async def test_a_silent_log_gets_heartbeat_lines_without_a_blank_line(
    pushed: bool,
) -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [b"data: 1\n\n"])
    clock = ManualClock()
    limits = StreamLimits(heartbeat_interval_s=0.01, clock=clock)
    response = await reader_of(store, limits=limits, pushed=pushed)
    reader = Reader()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(response, {"type": "http"}, reader.receive, reader.send)
        beat = lambda: b": keep-alive\n" in reader.body  # noqa: E731
        await on_clock(clock, anyio.sleep_forever, 0.005, beat)
        await store.append("r", [b"data: 2\n\n"])
        await store.finish("r")
    assert reader.body.startswith(b"id: r.0\ndata: 1\n\n: keep-alive\n")
    assert b": keep-alive\n\n" not in reader.body
    assert reader.body.endswith(b"id: r.1\ndata: 2\n\n")
    assert reader.completed
    assert response.cut is None


async def test_a_reader_that_accepts_no_byte_is_cut() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    await store.append("r", [b"data: 1\n\n"])
    clock = ManualClock()
    limits = StreamLimits(heartbeat_interval_s=10, stuck_timeout_s=0.02, clock=clock)
    response = await reader_of(store, limits=limits)
    reader = Reader(block_after=0)
    await on_clock(
        clock, lambda: response({"type": "http"}, reader.receive, reader.send), 0.005
    )
    assert response.cut is not None
    assert "no byte accepted" in response.cut
    assert not await store.attached("r")


async def test_a_reader_that_falls_behind_the_bound_is_cut() -> None:
    store = MemoryEventStore(max_log_bytes=20)
    await store.create("r", "k")
    await store.append("r", [b"data: 1\n\n"])
    response = await reader_of(store)
    reader = Reader()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(response, {"type": "http"}, reader.receive, reader.send)
        await anyio.sleep(0.01)
        await store.append("r", [b"data: %d\n\n" % i for i in range(2, 9)])
    assert response.cut == "fell behind the log's bound"
    assert not reader.completed


async def test_a_lost_producer_ends_the_reader_with_one_error_event() -> None:
    async def batches() -> AsyncGenerator[Frames, None]:
        yield [(0, b"data: 1\n\n")]
        raise ProducerLost("its replica died")

    iterator = batches()
    first = await anext(iterator)
    response = LogStreamResponse("r", first, iterator, StreamLimits())
    reader = Reader()
    with anyio.fail_after(5):
        await response({"type": "http"}, reader.receive, reader.send)
    assert reader.body.startswith(b'id: r.0\ndata: 1\n\ndata: {"error"')
    assert f'"code":"{PRODUCER_LOST}"'.encode() in reader.body
    assert reader.completed


@PUSHED
async def test_a_reader_whose_client_leaves_is_cut(pushed: bool) -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    response = await reader_of(store, pushed=pushed)
    reader = Reader()
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(response, {"type": "http"}, reader.receive, reader.send)
        await asyncio.sleep(0.01)
        reader.gone.set()
    assert response.cut == "the client disconnected"
    assert not await store.attached("r")


async def test_a_resumable_stream_is_padded_like_a_live_one_unless_asked_not_to() -> (
    None
):
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    options = {"include_usage": True, "resumable": True}
    padded = await exchange(app, CHAT, {**RESUMABLE, "stream_options": options})
    plain = await exchange(app, CHAT, RESUMABLE)  # include_obfuscation false
    for ex, pads in ((padded, True), (plain, False)):
        datas = [
            line[len(b"data: ") :]
            for line in ex.body.split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"
        ]
        assert datas
        assert all((b'"obfuscation":' in data) is pads for data in datas), ex.body


class HeldReader(Reader):
    """A ``Reader`` whose body writes number ``held`` (0-based) and later wait
    on ``gate`` (a socket behind), and whose write number ``broken`` raises
    (after its wait); ``started`` counts the body writes begun."""

    def __init__(self, held: int | None = None, broken: int | None = None) -> None:
        super().__init__()
        self.gate = anyio.Event()
        self._held = held
        self._broken = broken
        self.started = 0

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            write, self.started = self.started, self.started + 1
            if self._held is not None and write >= self._held:
                await self.gate.wait()
            if write == self._broken:
                raise OSError("the connection broke")
        self.messages.append(message)


class LeavingReader(HeldReader):
    """A ``HeldReader`` whose client leaves when ``gone`` is set; ``on_leave``
    runs after the disconnect is read and before the reader's task sees it (a
    frame appended in that same turn of the loop)."""

    def __init__(self, on_leave: Callable[[], object], held: int | None = None):
        super().__init__(held=held)
        self._on_leave = on_leave

    async def receive(self) -> Message:
        await self.gone.wait()
        asyncio.get_running_loop().call_soon(self._on_leave)
        return {"type": "http.disconnect"}


def frames_of(*numbers: int) -> bytes:
    return b"".join(b"id: r.%d\ndata: %d\n\n" % (n, n) for n in numbers)


@contextlib.asynccontextmanager
async def serving(response: LogStreamResponse, reader: Reader) -> AsyncIterator[None]:
    """Run ``response`` for ``reader`` until the block and the response end (5 s
    at most: a hang guard); the block starts once the status went out and the
    response waits on its store."""
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(response, {"type": "http"}, reader.receive, reader.send)
            await wait_until(lambda: bool(reader.messages), timeout_s=5)  # status
            await asyncio.sleep(0.01)  # the reader waits on the store
            yield


async def test_a_pushed_frame_is_written_in_the_appending_call() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    response = await reader_of(store, pushed=True)
    reader = Reader()
    async with serving(response, reader):
        for n in range(3):
            store.append_nowait("r", [b"data: %d\n\n" % n])
            assert reader.body.endswith(frames_of(n))  # no task ran in between
        await store.finish("r")
    assert reader.body == frames_of(0, 1, 2)
    assert reader.completed


async def test_a_pushed_write_that_waits_is_finished_before_later_frames() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    response = await reader_of(store, pushed=True)
    reader = HeldReader(held=1)
    async with serving(response, reader):
        store.append_nowait("r", [b"data: 0\n\n"])  # written at once
        store.append_nowait("r", [b"data: 1\n\n"])  # its write waits
        for n in range(2, 5):  # refused while it waits: the reader's task
            store.append_nowait("r", [b"data: %d\n\n" % n])
        assert reader.body == frames_of(0)
        await asyncio.sleep(0.01)
        reader.gate.set()
        await store.finish("r")
    assert reader.body == frames_of(0, 1, 2, 3, 4)
    assert reader.completed
    assert response.cut is None


@pytest.mark.parametrize("held", [None, 0], ids=["at-once", "after-a-wait"])
async def test_a_pushed_write_that_breaks_ends_the_body_without_more_frames(
    held: int | None,
) -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    response = await reader_of(store, pushed=True)
    reader = HeldReader(held=held, broken=1)
    reader.gate.set()
    async with serving(response, reader):
        for n in range(4):
            store.append_nowait("r", [b"data: %d\n\n" % n])
            await asyncio.sleep(0.01)
    assert reader.body == frames_of(0)
    assert not reader.completed
    assert not await store.attached("r")


async def test_a_pushed_reader_whose_write_waits_past_the_bound_is_cut() -> None:
    store = MemoryEventStore(max_log_bytes=20)
    await store.create("r", "k")
    response = await reader_of(store, pushed=True)
    reader = HeldReader(held=0)
    async with serving(response, reader):
        store.append_nowait("r", [b"data: 0\n\n"])  # its write waits
        store.append_nowait("r", [b"data: %d\n\n" % i for i in range(1, 9)])
        reader.gate.set()
    assert response.cut == "fell behind the log's bound"
    assert reader.body == frames_of(0)
    assert not reader.completed


@pytest.mark.parametrize("held", [None, 0], ids=["at-once", "waits"])
async def test_a_frame_appended_as_the_client_leaves_is_not_pushed(
    held: int | None,
) -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    response = await reader_of(store, pushed=True)
    reader = LeavingReader(lambda: store.append_nowait("r", [b"data: 0\n\n"]), held)
    async with serving(response, reader):
        reader.gone.set()
    assert response.cut == "the client disconnected"
    assert reader.started == 0  # no write begun that nothing would finish
    assert not await store.attached("r")


class BlindPusher:
    """A ``read_pushed`` whose push the test calls, whatever the reader does."""

    def __init__(self) -> None:
        self.capabilities = StoreCapabilities(push_read=self)
        self.push: Callable[[Frames], bool] | None = None
        self.answers: list[bool] = []

    async def read_pushed(
        self, response_id: str, owner: str, after: int, push: Callable[[Frames], bool]
    ) -> AsyncGenerator[Frames, None]:
        self.push = push
        yield []
        await asyncio.Event().wait()  # no frame but the pushed ones
        yield []

    def offer(self, seq: int) -> None:
        assert self.push is not None
        self.answers.append(self.push([(seq, b"data: %d\n\n" % seq)]))


async def test_the_eager_write_refuses_a_frame_while_the_reader_is_cancelled() -> None:
    store = BlindPusher()
    response = await reader_of(store, pushed=True)
    reader = LeavingReader(lambda: store.offer(1), held=1)
    async with serving(response, reader):
        store.offer(0)  # taken: written at once
        reader.gone.set()
    assert store.answers == [True, False]
    assert reader.started == 1
    assert reader.body == frames_of(0)
    assert response.cut == "the client disconnected"


async def test_a_pushed_write_that_waits_then_breaks_cuts_the_reader_at_once() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    limits = StreamLimits(stuck_timeout_s=3600, heartbeat_interval_s=3600)
    response = await reader_of(store, limits=limits, pushed=True)
    reader = HeldReader(held=1, broken=1)
    async with serving(response, reader):
        store.append_nowait("r", [b"data: 0\n\n"])  # written at once
        store.append_nowait("r", [b"data: 1\n\n"])  # waits, then breaks
        reader.gate.set()
    assert response.cut == BROKEN
    assert reader.body == frames_of(0)
    assert not reader.completed
    assert not await store.attached("r")


async def test_a_heartbeat_that_breaks_leaves_the_next_frame_pushed() -> None:
    store = MemoryEventStore()
    await store.create("r", "k")
    clock = ManualClock()
    limits = StreamLimits(heartbeat_interval_s=0.01, clock=clock)
    response = await reader_of(store, limits=limits, pushed=True)
    reader = HeldReader(broken=0)  # the first body write, a heartbeat, breaks
    async with serving(response, reader):
        began = lambda: reader.started >= 1  # noqa: E731
        await on_clock(clock, anyio.sleep_forever, 0.005, began)
        store.append_nowait("r", [b"data: 0\n\n"])
        assert reader.body.endswith(frames_of(0))  # pushed: no write in flight
        await store.finish("r")
    assert reader.completed
