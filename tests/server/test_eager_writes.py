"""The eager write path: frames written from the producer's callback.

Without pacing, an event that comes while the stream's writer task waits with
nothing queued is written in the engine's loop turn (``EventFrames``,
``FrameSink.offer``), driving ``send`` by hand; a ``send`` that suspends is
handed to the task as a ``Resume``. ``SpyExchange``
records, per body message, whether the writer task started it, and runs
``before`` first (which may suspend or raise).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import warnings
from collections.abc import Awaitable, Callable, Generator
from contextvars import Context, ContextVar, copy_context
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from sluicegate.core.endstate import EndState
from sluicegate.core.wire.sse import DONE
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.streaming import sink
from sluicegate.server.streaming.sink import Resume
from sluicegate.server.streaming.sse_response import EventStreamResponse
from tests.polling import wait_until

from .asgi import CHAT, HELLO, Exchange

pytestmark = pytest.mark.anyio

STREAM = {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture(autouse=True)
def stream_writer(monkeypatch: pytest.MonkeyPatch) -> str:
    """These tests are about eager writes, whatever the suite's writer."""
    monkeypatch.setattr(EventStreamResponse, "eager", True)
    return "eager"


class SpyExchange(Exchange):
    """Runs ``before(n)`` ahead of the n-th body message (0: the role chunk)."""

    def __init__(
        self, app: Starlette, before: Callable[[int], Awaitable[None]] | None = None
    ) -> None:
        super().__init__(app, CHAT, STREAM)
        self.before = before
        self.attempts = 0
        self.by_writer: list[bool] = []  # per attempt: started in the writer task?
        self._task: asyncio.Task[Any] | None = None

    async def run(self) -> None:
        self._task = asyncio.current_task()
        await super().run()

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            n, self.attempts = self.attempts, self.attempts + 1
            self.by_writer.append(asyncio.current_task() is self._task)
            if self.before is not None:
                await self.before(n)
        await super()._send(message)


def _end_state(app: Starlette) -> EndState:
    ledger: Ledger = app.state.ledger
    return ledger.rows[-1].end_state


def _shape(ex: Exchange) -> list[Any]:
    """The payloads without id/created, each run of content chunks as one text."""
    shape: list[Any] = []
    for payload in ex.payloads():
        drop = ("id", "created", "obfuscation")
        payload = {k: v for k, v in payload.items() if k not in drop}
        choices = payload.get("choices") or [{}]
        delta = choices[0].get("delta", {})
        if list(delta) == ["content"] and choices[0]["finish_reason"] is None:
            if shape and isinstance(shape[-1], str):
                shape[-1] += delta["content"]
            else:
                shape.append(delta["content"])
        else:
            shape.append(payload)
    return shape


def _assert_complete(ex: Exchange) -> None:
    """Role, the whole text once, finish, usage, one [DONE], in that order."""
    role, text, finish, usage = _shape(ex)
    assert role["choices"][0]["delta"] == {"role": "assistant"}
    assert text == DEFAULT_TEXT
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] > 0
    assert ex.body.endswith(b"data: [DONE]\n\n")
    assert (ex.done_count(), ex.completed) == (1, True)


async def _run(ex: Exchange) -> None:
    with anyio.fail_after(5):
        await ex.run()


async def test_a_stream_written_eagerly_matches_a_paced_one() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    ex = SpyExchange(app)
    await _run(ex)
    _assert_complete(ex)
    assert _end_state(app) is EndState.FINISHED
    # The role chunk and the closing empty body come from the task; every frame
    # between went out from the engine's callback, without waking the task.
    assert ex.by_writer == [True] + [False] * (ex.attempts - 2) + [True]
    assert ex.attempts > 5

    paced_config = ServerConfig(stream_interval_s=0.001)
    paced_app = create_app(ScriptedEngine(tokens_per_s=2000), paced_config)
    paced = SpyExchange(paced_app)
    await _run(paced)
    assert all(paced.by_writer)  # pacing never writes eagerly
    assert _shape(paced) == _shape(ex)
    assert _end_state(paced_app) is EndState.FINISHED


async def test_a_send_that_suspends_is_finished_by_the_task_in_order() -> None:
    handed_over = 0

    async def every_third_waits(n: int) -> None:
        nonlocal handed_over
        if n % 3 == 2:
            handed_over += asyncio.current_task() is None
            await asyncio.sleep(0.002 if n % 2 else 0)  # a future, or a bare yield

    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    ex = SpyExchange(app, every_third_waits)
    await _run(ex)
    _assert_complete(ex)
    assert handed_over > 0  # suspended in the engine's callback, finished later
    assert _end_state(app) is EndState.FINISHED


async def test_a_connection_broken_during_an_eager_write_aborts() -> None:
    async def reset(n: int) -> None:
        if n == 3:
            raise OSError("connection reset by peer")

    engine = ScriptedEngine(tokens_per_s=2000)
    app = create_app(engine, ServerConfig())
    ex = SpyExchange(app, reset)
    await _run(ex)
    assert ex.attempts == 4  # nothing more was written to the broken connection
    assert not ex.by_writer[3]  # the failing write was an eager one
    assert (len(ex.contents()), ex.completed) == (2, False)
    assert _end_state(app) is EndState.ABORTED
    assert engine.stats().aborted_ids == (f"{ex.payloads()[0]['id']}-0",)

    again = SpyExchange(app)
    await _run(again)
    _assert_complete(again)
    assert _end_state(app) is EndState.FINISHED


async def test_a_bug_during_an_eager_write_is_logged_then_one_internal_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def bug(n: int) -> None:
        if n == 3:
            raise RuntimeError("secret send bug")

    engine = ScriptedEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    ex = SpyExchange(app, bug)
    await _run(ex)
    assert len(ex.contents()) == 2
    error = ex.only_error()
    assert error["code"] == "internal_error"
    assert "secret" not in error["message"]
    # The failing write was eager; the error event and the close come from the task.
    assert ex.by_writer[3:] == [False, True, True]
    assert (ex.done_count(), ex.completed) == (0, True)
    assert _end_state(app) is EndState.ERRORED
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in logged] == ["sluicegate.server.streaming.sse_response"]
    assert "secret send bug" in caplog.text  # with the traceback
    assert (engine.stats().running, engine.stats().kv_cells_used) == (0, 0)


class _LeavesAfterDone(SpyExchange):
    async def _send(self, message: Message) -> None:
        await super()._send(message)
        if DONE in message.get("body", b""):
            self.leave()  # the disconnect wakes the watcher before the writer


async def test_a_client_that_leaves_right_after_an_eager_done_is_finished() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    ex = _LeavesAfterDone(app)
    await _run(ex)
    assert (ex.done_count(), ex.completed) == (1, False)  # the close found it gone
    assert ex.by_writer[-2:] == [False, True]  # [DONE] went out eagerly
    assert _end_state(app) is EndState.FINISHED


@pytest.mark.parametrize(
    ("leave_at_once", "ended_by"),
    [(False, asyncio.CancelledError), (True, asyncio.CancelledError)],
    ids=["while-the-task-awaits-it", "before-the-task-takes-it"],
)
async def test_leaving_during_a_handed_over_write_aborts_and_closes_it(
    leave_at_once: bool,
    ended_by: type[BaseException],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Awaited by the task: the cancellation goes through ``Resume`` into the
    # write. Not taken yet: ``FrameSink.close()`` throws one into it, as a
    # cancelled task would.
    kept: list[Resume] = []  # held here: only an explicit close() ends it

    def keep(
        steps: Generator[Any, Any, Any], waiting_on: Any, context: Context
    ) -> Resume:
        kept.append(Resume(steps, waiting_on, context))
        return kept[-1]

    monkeypatch.setattr(sink, "Resume", keep)
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=2000)
    app = create_app(engine, ServerConfig())
    seen: list[object] = []  # started in a callback?, then how it ended

    async def block(n: int) -> None:
        if n != 3:
            return
        seen.append(asyncio.current_task() is None)
        if leave_at_once:
            ex.leave()
        try:
            await asyncio.Event().wait()  # the socket never drains
        except BaseException as exc:
            seen.append(type(exc))
            raise
        finally:
            seen.append("finally")

    ex = SpyExchange(app, block)
    tasks_before = asyncio.all_tasks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ex.run)
                await ex.wait_for(lambda: bool(seen))
                ex.leave()
        assert ex.returned
        assert (seen, len(kept)) == ([True, ended_by, "finally"], 1)
        gc.collect()
    assert [str(w.message) for w in caught] == []
    await anyio.sleep(0.01)
    assert asyncio.all_tasks() <= tasks_before | {asyncio.current_task()}
    assert _end_state(app) is EndState.ABORTED
    assert engine.stats().aborted_ids == (f"{ex.payloads()[0]['id']}-0",)
    assert (len(ex.contents()), ex.completed) == (2, False)


class _Steps:
    """A hand-made awaitable: yields "a", "b" (or "c" after a ``KeyError``);
    records what it is sent and thrown, and whether its ``finally`` ran."""

    def __init__(self) -> None:
        self.got: list[object] = []
        self.finally_ran = False

    def __await__(self) -> Generator[str, object, None]:
        try:
            self.got.append((yield "a"))
            try:
                self.got.append((yield "b"))
            except KeyError as exc:
                self.got.append(exc)
                self.got.append((yield "c"))
        finally:
            self.finally_ran = True


def _resumed(steps: _Steps) -> tuple[Generator[Any, Any, Any], Resume]:
    """``steps`` started by hand (it yielded "a"), and its ``Resume``."""
    inner = steps.__await__()
    return inner, Resume(inner, inner.send(None), copy_context())


def test_resume_forwards_sent_values_and_thrown_exceptions() -> None:
    steps = _Steps()
    resume = _resumed(steps)[1].__await__()
    assert resume.send(None) == "a"  # re-yields what the start waited on
    assert resume.send(1) == "b"
    with pytest.raises(StopIteration):
        resume.send(2)
    assert (steps.got, steps.finally_ran) == ([1, 2], True)

    steps = _Steps()
    resume = _resumed(steps)[1].__await__()
    resume.send(None)
    resume.send(1)
    caught = KeyError("caught")
    assert resume.throw(caught) == "c"  # the awaitable caught it and went on
    with pytest.raises(ValueError, match="not caught"):
        resume.throw(ValueError("not caught"))
    assert (steps.got, steps.finally_ran) == ([1, caught], True)


def test_resume_close_closes_the_awaitable() -> None:
    steps = _Steps()
    inner, resume = _resumed(steps)
    resume.close()
    assert steps.finally_ran
    with pytest.raises(StopIteration):
        inner.send(None)  # closed: it runs no more


async def test_resume_in_a_task_delivers_results_and_cancellation() -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []

    async def write(fut: asyncio.Future[int]) -> None:
        try:
            seen.append(await fut)
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("finally")

    fut: asyncio.Future[int] = loop.create_future()
    inner = write(fut).__await__()
    assert inner.send(None) is fut  # started by hand: waits on fut
    task = asyncio.ensure_future(Resume(inner, fut, copy_context()))
    await asyncio.sleep(0)
    fut.set_result(7)
    await asyncio.sleep(0.01)
    assert (seen, task.done()) == ([7], False)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [7, "cancelled", "finally"]


SPAN: ContextVar[str] = ContextVar("span", default="-")


def _traced(app: Starlette, seen: dict[str, set[str]]) -> Any:
    """Wraps ``app`` from outside, as tracing middleware does: each request sets
    its own ``SPAN``; its ``send`` records the ``SPAN`` it sees, and sets and
    resets the variable around each message (a span per write)."""

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        mine = f"request-{len(seen)}"
        SPAN.set(mine)
        seen[mine] = set()

        async def traced_send(message: Message) -> None:
            seen[mine].add(SPAN.get())
            token = SPAN.set(mine + "/write")
            try:
                await send(message)
            finally:
                SPAN.reset(token)  # ValueError if reset in another context

        await app(scope, receive, traced_send)

    return traced_app


async def test_a_send_wrapper_keeps_its_request_context_when_written_eagerly() -> None:
    # Every third body message suspends, so some writes start in the engine's
    # callback and end in the task: the wrapper's set/reset must pair up, and
    # each request's send must see that request's variables, not another's.
    seen: dict[str, set[str]] = {}
    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    exchanges: list[SpyExchange] = []

    async def sometimes_behind(n: int) -> None:
        if n % 3 == 2:
            await asyncio.sleep(0)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                ex = SpyExchange(app, sometimes_behind)
                ex.app = _traced(app, seen)
                exchanges.append(ex)
                tg.start_soon(ex.run)
                await anyio.sleep(0.002)
    for ex in exchanges:
        _assert_complete(ex)
        assert not all(ex.by_writer)  # some writes went out eagerly
    assert seen == {"request-0": {"request-0"}, "request-1": {"request-1"}}


async def test_a_send_that_raises_cancelled_eagerly_fails_its_stream_only() -> None:
    # Not an exception a send should raise outside a cancellation; it must
    # still end this stream (in the task) instead of escaping into the engine.
    engine = ScriptedEngine(tokens_per_s=2000)
    app = create_app(engine, ServerConfig())

    async def cancelled_at_third(n: int) -> None:
        if n == 3:
            raise asyncio.CancelledError

    ex = SpyExchange(app, cancelled_at_third)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(lambda: ex.returned)
    assert ex.by_writer[3] is False  # it was raised in the engine's callback
    assert ex.done_count() == 0
    await wait_until(lambda: engine.stats().running == 0)
    second = SpyExchange(app)
    await _run(second)
    _assert_complete(second)


@pytest.mark.parametrize("awaits_in_finally", [False, True])
async def test_a_handed_over_write_is_closed_in_its_request_context(
    awaits_in_finally: bool, caplog: pytest.LogCaptureFixture
) -> None:
    # The socket is behind on an eager write and the client leaves before the
    # task takes the write over: ending it runs the wrapper's ``finally`` (a
    # ContextVar reset, maybe an await) under CancelledError in the context the
    # write started in, so the stream ends aborted, not errored, with nothing
    # logged and no timer left behind.
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=2000)
    app = create_app(engine, ServerConfig())
    bodies = 0
    blocked = asyncio.Event()

    async def traced_app(scope: Any, receive: Any, send: Any) -> None:
        SPAN.set("request")

        async def traced_send(message: Message) -> None:
            nonlocal bodies
            token = SPAN.set("write")
            try:
                if message["type"] == "http.response.body":
                    bodies += 1
                    if bodies == 4:  # an eager write (the role chunk was 1)
                        ex.leave()
                        blocked.set()
                        await asyncio.Event().wait()  # the socket never drains
                if blocked.is_set():
                    return  # gone: uvicorn's send drops the message, silently
                await send(message)
            finally:
                SPAN.reset(token)  # ValueError in any other context
                if awaits_in_finally:
                    await asyncio.sleep(0)  # an async flush, say: not under close()

        await app(scope, receive, traced_send)

    ex = Exchange(app, CHAT, STREAM)
    ex.app = traced_app
    with caplog.at_level(logging.ERROR), anyio.fail_after(5):
        await ex.run()
    assert blocked.is_set()
    assert [r.getMessage() for r in caplog.records] == []
    assert _end_state(app) is EndState.ABORTED
    loop = asyncio.get_running_loop()
    scheduled = getattr(loop, "_scheduled", [])  # asyncio's own loop only
    assert not [h for h in scheduled if "WriteWatch" in repr(h)]
    assert engine.stats().running == 0
