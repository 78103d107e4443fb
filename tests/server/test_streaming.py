"""Streamed responses: headers, framing, order, stop strings, heartbeats, errors.

Every test runs with each writer (``stream_writer``): the eager one and its plain
twin.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineError
from sluicegate.core.events import Delta, EngineOutput, FinishReason
from sluicegate.core.wire.sse import DONE
from sluicegate.engines.base import Capabilities, GenerateRequest, SamplingParams
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.streaming.buffer import LiveStreams
from sluicegate.server.streaming.sse_response import EventStreamResponse

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange, on_clock

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True, params=["eager", "task"])
def stream_writer(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Unpaced streams are written eagerly, then by the pump's task only
    (whatever ``SLUICEGATE_TEST_WRITER`` says)."""
    monkeypatch.setattr(EventStreamResponse, "eager", request.param == "eager")
    return str(request.param)


def _ledger(app: Starlette) -> Ledger:
    ledger: Ledger = app.state.ledger
    return ledger


def _finish_reasons(payloads: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [
        (c["index"], c["finish_reason"])
        for p in payloads
        for c in p.get("choices", [])
        if c["finish_reason"] is not None
    ]


async def test_headers_are_exact_and_never_compressed(app: Starlette) -> None:
    gzip = [(b"accept-encoding", b"gzip")]
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True}, extra_headers=gzip)
    with anyio.fail_after(5):
        await ex.run()
    assert ex.status == 200
    assert ex.headers == [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    assert app.user_middleware == []  # no GZip, nor anything else that buffers
    assert ex.completed


async def test_chat_stream_has_role_first_content_finish_and_one_done(
    app: Starlette,
) -> None:
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    events = ex.events()
    assert [e.data for e in events].count("[DONE]") == 1
    assert events[-1].data == "[DONE]"
    payloads = ex.payloads()
    assert len({(p["id"], p["created"], p["model"]) for p in payloads}) == 1
    assert payloads[0]["id"].startswith("chatcmpl-")
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert all("role" not in p["choices"][0]["delta"] for p in payloads[1:])
    assert all("usage" not in p for p in payloads)
    assert "".join(ex.contents()) == DEFAULT_TEXT
    assert _finish_reasons(payloads) == [(0, "stop")]
    assert payloads[-1]["choices"][0]["finish_reason"] == "stop"
    row = _ledger(app).rows[-1]
    assert (row.end_state, row.status) == (EndState.FINISHED, 200)
    assert row.finish_reasons == (FinishReason.STOP,)
    assert row.completion_tokens > 0
    assert row.first_token_at is not None
    assert row.received_at <= row.first_token_at <= row.ended_at


async def test_multi_byte_characters_split_across_tokens_arrive_whole(
    app: Starlette,
) -> None:
    ex = await exchange(app, COMPLETIONS, {"prompt": "Hi", "stream": True})
    ex.body.decode("utf-8")  # raises if the raw bytes are not valid UTF-8
    deltas = ex.contents()
    assert "".join(deltas) == DEFAULT_TEXT
    assert not any("\ufffd" in d for d in deltas)
    assert "日本語" in "".join(deltas)


async def test_usage_chunk_is_last_with_no_choices_when_asked(app: Starlette) -> None:
    body = {
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ex = await exchange(app, CHAT, body)
    payloads = ex.payloads()
    usage_chunks = [p for p in payloads if p["usage"] is not None]
    assert usage_chunks == [payloads[-1]]
    assert payloads[-1]["choices"] == []
    usage = payloads[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    row = _ledger(app).rows[-1]
    assert usage["prompt_tokens"] == row.prompt_tokens
    assert usage["completion_tokens"] == row.completion_tokens
    assert ex.events()[-1].data == "[DONE]"


async def test_two_choices_each_finish_once_before_one_done(app: Starlette) -> None:
    ex = await exchange(
        app, COMPLETIONS, {"prompt": "Once upon a time", "n": 2, "stream": True}
    )
    payloads = ex.payloads()
    assert sorted(_finish_reasons(payloads)) == [(0, "stop"), (1, "stop")]
    assert ex.done_count() == 1
    assert ex.events()[-1].data == "[DONE]"
    for index in (0, 1):
        text = "".join(
            c["text"] for p in payloads for c in p["choices"] if c["index"] == index
        )
        assert text == DEFAULT_TEXT
    assert _ledger(app).rows[-1].finish_reasons == (FinishReason.STOP,) * 2


async def test_stop_string_split_across_tokens_is_held_back_and_stops() -> None:
    engine = ScriptedEngine("Here: ABCDEFGHIJKLMNOP", never_finishes=True)
    app = create_app(engine, ServerConfig())
    body = {"prompt": "Hi", "stop": ["DEFGHIJ"], "stream": True}
    ex = await exchange(app, COMPLETIONS, body)
    assert "".join(ex.contents()) == "Here: ABC"
    assert not any("D" in delta for delta in ex.contents())
    assert _finish_reasons(ex.payloads()) == [(0, "stop")]
    assert ex.done_count() == 1
    stats = engine.stats()  # stopped in the engine, counted as finished
    assert (stats.running, stats.finished_requests, stats.aborted_ids) == (0, 1, ())


async def test_held_back_text_is_released_when_the_stop_is_ruled_out() -> None:
    engine = ScriptedEngine("ABCDEFGHI")
    app = create_app(engine, ServerConfig())
    body = {"prompt": "Hi", "stop": ["DEFX"], "stream": True}
    ex = await exchange(app, COMPLETIONS, body)
    assert ex.contents() == ["ABC", "DEFGHI"]
    assert _finish_reasons(ex.payloads()) == [(0, "stop")]


async def test_held_back_tail_is_flushed_before_a_length_finish() -> None:
    engine = ScriptedEngine("sky?\nAl more")
    app = create_app(engine, ServerConfig())
    body = {"prompt": "Hi", "stop": ["?\nAlice"], "max_tokens": 7, "stream": True}
    ex = await exchange(app, COMPLETIONS, body)
    assert "".join(ex.contents()) == "sky?\nAl"
    payloads = ex.payloads()
    assert payloads[-1]["choices"][0] == {
        "index": 0,
        "text": "",
        "logprobs": None,
        "finish_reason": "length",
    }
    assert payloads[-2]["choices"][0]["text"].endswith("Al")


async def test_heartbeat_comments_flow_during_a_long_prefill() -> None:
    # 12 intervals of silence on a manual clock: one heartbeat per interval.
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=0.6, clock=clock)
    config = ServerConfig(heartbeat_interval_s=0.05)
    app = create_app(engine, config, clock=clock)
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    await on_clock(clock, ex.run, 0.01)
    before_content = ex.body.split(b'"content"')[0]
    assert 11 <= before_content.count(b": keep-alive") <= 12
    assert ex.events()[-1].data == "[DONE]"
    assert "".join(ex.contents()) == DEFAULT_TEXT


async def test_heartbeat_comments_flow_during_the_queue_wait() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1, clock=clock)
    hog = engine.generate(GenerateRequest("hog", (1, 2), SamplingParams(10)))
    config = ServerConfig(heartbeat_interval_s=0.02)
    app = create_app(engine, config, clock=clock)
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    with anyio.move_on_after(5) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            beats = lambda: ex.body.count(b": keep-alive") >= 3  # noqa: E731
            await on_clock(clock, anyio.sleep_forever, 0.01, beats)
            assert engine.stats().queued == 1
            ex.leave()
    assert not deadline.cancelled_caught
    assert engine.stats().queued == 0
    engine.abort("hog")
    assert [o async for o in hog] == []


async def test_wake_ups_with_nothing_to_write_send_nothing() -> None:
    # A poke before the heartbeat is due, and a delta without text (which the
    # machine turns into no frame), must not reach the client as a body message.
    # The prefill, on a manual clock, lasts until the test moves the clock.
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=1.0, clock=clock)
    app = create_app(engine, ServerConfig(heartbeat_interval_s=10), clock=clock)
    live: LiveStreams = app.state.live
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(lambda: bool(ex.body) and len(live) == 1)
            sent = len(ex.messages)
            [buffer] = live.buffers
            for _ in range(3):
                buffer.poke()
                await anyio.sleep(0.005)
            buffer.put(Delta(0, ""))
            await anyio.sleep(0.005)
            assert engine.stats().generated_tokens == 0  # still in the prefill
            assert len(ex.messages) == sent
            await on_clock(clock, anyio.sleep_forever, 0.05, lambda: ex.returned)
    assert b"keep-alive" not in ex.body
    assert live.heartbeats_sent == 0
    assert "".join(ex.contents()) == DEFAULT_TEXT
    assert ex.done_count() == 1


async def test_engine_error_after_first_token_is_one_error_event_without_done() -> None:
    engine = ScriptedEngine(fail_at_step=1)
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    payloads = ex.payloads()
    error = ex.only_error()
    assert error["message"]
    assert error["code"] == "engine_error"
    assert ex.contents() == ["Hello"]
    assert _finish_reasons(payloads) == []
    assert ex.done_count() == 0
    assert ex.completed
    row = _ledger(app).rows[-1]
    assert (row.end_state, row.status) == (EndState.ERRORED, 200)
    assert row.completion_tokens == 1
    assert engine.stats().failed_requests == 1
    assert engine.stats().kv_cells_used == 0


class _BrokenEngine(ScriptedEngine):
    """Its outputs raise a plain bug (not an ``EngineError``) after one step."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logprobs=True)  # plain iterators: not listenable

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        outputs = super().generate(request)

        async def broken() -> AsyncIterator[EngineOutput]:
            yield await anext(outputs)
            raise RuntimeError("secret internal detail")

        return broken()


async def test_unexpected_exception_is_one_generic_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = _BrokenEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    payloads = ex.payloads()
    error = ex.only_error()
    assert error["code"] == "internal_error"
    assert "secret" not in error["message"]
    assert ex.done_count() == 0
    assert "secret internal detail" in caplog.text
    assert _ledger(app).rows[-1].end_state is EndState.ERRORED
    sequence_id = f"{payloads[0]['id']}-0"
    assert sequence_id in engine.stats().aborted_ids


class _SilentEndEngine(ScriptedEngine):
    """Its outputs end after one step without any finish reason."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logprobs=True)  # plain iterators: not listenable

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        outputs = super().generate(request)

        async def cut_short() -> AsyncIterator[EngineOutput]:
            yield await anext(outputs)

        return cut_short()


async def test_outputs_ending_without_finish_reason_are_an_error_event() -> None:
    engine = _SilentEndEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    payloads = ex.payloads()
    assert "without a finish reason" in payloads[-1]["error"]["message"]
    assert ex.done_count() == 0
    assert _ledger(app).rows[-1].end_state is EndState.ERRORED


async def test_a_connection_broken_before_the_first_frame_aborts() -> None:
    engine = ScriptedEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True}, fail_send_after=0)
    with anyio.fail_after(2):
        await ex.run()
    assert ex.status == 200
    assert ex.body == b""
    assert _ledger(app).rows[-1].end_state is EndState.ABORTED
    assert len(engine.stats().aborted_ids) == 1


class _EngineErrorEngine(ScriptedEngine):
    """Plain async iterators that raise ``EngineError`` where the finish was."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logprobs=True)  # plain iterators: not listenable

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        outputs = super().generate(request)

        async def failing() -> AsyncIterator[EngineOutput]:
            async for output in outputs:
                if output.finish_reason is not None:
                    raise EngineError("the model went away")
                yield output

        return failing()


async def test_engine_error_from_a_plain_async_iterator_is_one_error_event() -> None:
    engine = _EngineErrorEngine([20, 21, 22])
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, COMPLETIONS, {"prompt": "Hi", "stream": True})
    payloads = ex.payloads()
    error = ex.only_error()
    assert error["message"] == "the model went away"
    assert error["code"] == "engine_error"
    assert len(ex.contents()) == 3
    assert _finish_reasons(payloads) == []
    assert ex.done_count() == 0
    assert ex.completed
    assert _ledger(app).rows[-1].end_state is EndState.ERRORED


async def test_a_bug_while_decoding_a_step_is_one_internal_error_then_serves_on(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The step is decoded in the engine's own callback (a listener): the bug
    # must end this response, not the engine's clock or the next request.
    feed = ChoiceDecoder.feed
    calls = 0

    def buggy_feed(self: ChoiceDecoder, token_ids: Iterable[int]) -> ChoiceStep:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("secret decoder detail")
        return feed(self, token_ids)

    monkeypatch.setattr(ChoiceDecoder, "feed", buggy_feed)
    engine = ScriptedEngine(tokens_per_s=1000)
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    payloads = ex.payloads()
    error = ex.only_error()
    assert error["code"] == "internal_error"
    assert "secret" not in error["message"]
    assert len(ex.contents()) == 2
    assert ex.done_count() == 0
    assert ex.completed
    assert _ledger(app).rows[-1].end_state is EndState.ERRORED
    logged = [r for r in caplog.records if r.exc_info is not None]
    assert [r.name for r in logged] == ["sluicegate.server.streaming.generation"]
    assert logged[0].exc_info is not None
    assert "secret decoder detail" in str(logged[0].exc_info[1])
    assert f"{payloads[0]['id']}-0" in engine.stats().aborted_ids
    assert engine.stats().kv_cells_used == 0

    monkeypatch.undo()
    again = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert "".join(again.contents()) == DEFAULT_TEXT
    assert again.done_count() == 1
    assert _ledger(app).rows[-1].end_state is EndState.FINISHED


class _FaultySendExchange(Exchange):
    """``send`` raises ``errors`` in turn, from the first body that ``when`` picks."""

    def __init__(
        self,
        app: Starlette,
        when: Callable[[bytes], bool],
        errors: list[Exception],
    ) -> None:
        super().__init__(app, CHAT, {"messages": HELLO, "stream": True})
        self._when = when
        self._errors = errors
        self._failing = False

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and self._errors:
            self._failing = self._failing or self._when(message.get("body", b""))
            if self._failing:
                raise self._errors.pop(0)
        await super()._send(message)


def _has_content(body: bytes) -> bool:
    return b'"content"' in body


async def test_a_bug_while_writing_is_logged_then_one_internal_error_event(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = ScriptedEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    ex = _FaultySendExchange(app, _has_content, [RuntimeError("secret send bug")])
    with anyio.fail_after(5):
        await ex.run()
    payloads = ex.payloads()
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant"}
    error = ex.only_error()
    assert error["code"] == "internal_error"
    assert "secret" not in error["message"]
    assert ex.done_count() == 0
    assert ex.completed
    assert _ledger(app).rows[-1].end_state is EndState.ERRORED
    logged = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [r.name for r in logged] == ["sluicegate.server.streaming.sse_response"]
    assert "secret send bug" in caplog.text
    assert engine.stats().running == 0
    assert engine.stats().kv_cells_used == 0


async def test_a_bug_while_writing_then_a_broken_connection_aborts() -> None:
    engine = ScriptedEngine(never_finishes=True)
    app = create_app(engine, ServerConfig())
    errors: list[Exception] = [RuntimeError("send bug"), OSError("reset by peer")]
    ex = _FaultySendExchange(app, _has_content, errors)
    with anyio.fail_after(5):
        await ex.run()
    assert not [p for p in ex.payloads() if "error" in p]
    assert not ex.completed  # nothing more is written to a broken connection
    assert _ledger(app).rows[-1].end_state is EndState.ABORTED
    assert engine.stats().running == 0


async def test_a_bug_while_writing_the_last_frames_adds_no_frame_after_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The machine has ended: an error event may not follow [DONE].
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    ex = _FaultySendExchange(app, lambda body: DONE in body, [RuntimeError("bug")])
    with anyio.fail_after(5):
        await ex.run()
    assert not [p for p in ex.payloads() if "error" in p]
    assert ex.done_count() == 0  # the send that carried it raised
    assert ex.completed
    assert "stream chatcmpl-" in caplog.text
    assert engine.stats().kv_cells_used == 0
    # Neither [DONE] nor an error event went out, and the client is still there:
    # "truncated", as the client classifies what it received.
    assert _ledger(app).rows[-1].end_state is EndState.TRUNCATED
