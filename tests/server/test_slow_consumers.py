"""Slow consumers: coalescing, a bounded buffer, stuck streams, pacing, isolation.

A ``StalledExchange`` is an ``Exchange`` whose ``send`` blocks (like a socket whose
client stopped reading) once the gate is closed, until the test opens it again.
"""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest
from starlette.applications import Starlette
from starlette.types import Message

from sluicegate.core.endstate import EndState
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    ToolCallFragment,
    Usage,
)
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.streaming.buffer import (
    EVENT_COST_BYTES,
    LiveStreams,
    StreamBuffer,
)
from sluicegate.server.streaming.coalesce import coalesce, join_all_deltas, join_deltas

from .asgi import CHAT, HELLO, Exchange, on_clock

pytestmark = pytest.mark.anyio

STREAM = {"messages": HELLO, "stream": True}


class StalledExchange(Exchange):
    """``send`` blocks while ``gate`` is closed (after ``open_for`` body messages)."""

    def __init__(self, app: Starlette, payload: object, open_for: int) -> None:
        super().__init__(app, CHAT, payload)
        self.open_for = open_for
        self.gate = anyio.Event()
        self.blocked = False

    async def _send(self, message: Message) -> None:
        bodies = sum(m["type"] == "http.response.body" for m in self.messages)
        if message["type"] == "http.response.body" and bodies >= self.open_for:
            self.blocked = True
            await self.gate.wait()
            self.blocked = False
        await super()._send(message)


def _row(app: Starlette) -> tuple[EndState, int]:
    ledger: Ledger = app.state.ledger
    row = ledger.rows[-1]
    return row.end_state, row.completion_tokens


async def _engine_idle(engine: ScriptedEngine) -> None:
    with anyio.fail_after(2):
        while True:
            if not (engine.stats().running or engine.stats().queued):
                break
            await anyio.sleep(0.005)


def test_coalesce_joins_each_choices_deltas_and_keeps_order() -> None:
    events: list[StreamEvent] = [Delta(0, "a"), Delta(1, "x"), Delta(0, "b")]
    events += [Finish(0, FinishReason.STOP), Delta(1, "y"), End(Usage(1, 3))]
    merged, count = coalesce(events)
    assert merged == [
        Delta(0, "ab"),
        Delta(1, "xy"),
        Finish(0, FinishReason.STOP),
        End(Usage(1, 3)),
    ]
    assert count == 2
    assert coalesce([Delta(0, "a"), Fail("x"), Delta(0, "b")]) == (
        [Delta(0, "a"), Fail("x"), Delta(0, "b")],
        0,
    )
    later = join_deltas(
        Delta(0, "a", usage=Usage(1, 1)), Delta(0, "b", (), Usage(1, 2))
    )
    assert later == Delta(0, "ab", (), Usage(1, 2))
    with pytest.raises(ValueError, match="one choice"):
        join_deltas(Delta(0, "a"), Delta(1, "b"))


async def test_buffer_counts_utf8_bytes_and_reports_overflow_once() -> None:
    calls: list[int] = []
    cost = EVENT_COST_BYTES
    buffer = StreamBuffer(8 + 3 * cost, lambda: calls.append(1))
    buffer.put(Delta(0, "日本"))  # 6 bytes of text
    assert (buffer.pending_bytes, calls) == (6 + cost, [])
    buffer.put(Delta(0, "語"))
    assert (buffer.pending_bytes, calls) == (9 + 2 * cost, [])
    buffer.put(Delta(0, "x"))
    assert (buffer.pending_bytes, calls) == (10 + 3 * cost, [1])
    assert buffer.drain() == [Delta(0, "日本語x")]
    assert (buffer.pending_bytes, buffer.coalesced) == (0, 2)
    live = LiveStreams()
    live.open(buffer)
    assert (len(live), live.coalesced_events) == (1, 2)
    live.close(buffer)
    assert (len(live), live.coalesced_events) == (0, 2)


async def test_a_client_behind_gets_pending_deltas_merged_into_one_event() -> None:
    engine = ScriptedEngine(tokens_per_s=2000)
    app = create_app(engine, ServerConfig())
    ex = StalledExchange(app, STREAM, open_for=2)  # role chunk + first content
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(lambda: engine.stats().finished_requests == 1)
            ex.gate.set()
    assert "".join(ex.contents()) == DEFAULT_TEXT
    assert len(ex.contents()) <= 3  # first token, then what piled up (and maybe 1)
    assert ex.done_count() == 1
    assert app.state.live.coalesced_events > 10
    assert _row(app)[0] is EndState.FINISHED


async def test_a_stuck_client_is_aborted_after_the_stuck_timeout() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=100, clock=clock)
    config = ServerConfig(stuck_stream_timeout_s=0.3)
    app = create_app(engine, config, clock=clock)
    ex = StalledExchange(app, STREAM, open_for=2)
    await on_clock(clock, ex.run, 0.01)
    assert 0.3 <= clock.time() < 0.5  # caught within 1.25 x the timeout
    await _engine_idle(engine)
    assert engine.stats().aborted_requests == 1
    assert engine.stats().kv_cells_used == 0
    assert _row(app)[0] is EndState.ABORTED
    assert app.state.live.aborted_slow == 1
    assert len(app.state.live) == 0


async def test_a_full_buffer_aborts_the_stream_before_the_stuck_timeout() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=5000)
    config = ServerConfig(max_stream_buffer_bytes=200, stuck_stream_timeout_s=60)
    app = create_app(engine, config)
    ex = StalledExchange(app, STREAM, open_for=2)
    with anyio.fail_after(3):
        await ex.run()
    await _engine_idle(engine)
    assert engine.stats().kv_cells_used == 0
    assert _row(app)[0] is EndState.ABORTED


async def test_one_stalled_client_never_slows_another_stream() -> None:
    engine = ScriptedEngine(never_finishes=False, tokens_per_s=1000)
    app = create_app(engine, ServerConfig(stuck_stream_timeout_s=60))
    stalled = StalledExchange(app, STREAM, open_for=1)
    fine = Exchange(app, CHAT, STREAM)
    async with anyio.create_task_group() as tg:
        tg.start_soon(stalled.run)
        await stalled.wait_for(lambda: stalled.blocked)
        with anyio.fail_after(2):
            await fine.run()
        assert "".join(fine.contents()) == DEFAULT_TEXT
        assert stalled.blocked
        stalled.gate.set()
    assert "".join(stalled.contents()) == DEFAULT_TEXT


async def test_stream_interval_paces_events_but_not_the_first_token() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(tokens_per_s=400, clock=clock)  # 22 tokens: 0.055 s
    app = create_app(engine, ServerConfig(stream_interval_s=0.1), clock=clock)
    ex = Exchange(app, CHAT, STREAM)
    await on_clock(clock, ex.run, 0.0025)
    assert "".join(ex.contents()) == DEFAULT_TEXT
    # The first token at once; the rest came within the interval after it,
    # and goes out in one event when it ends.
    assert len(ex.contents()) == 2
    assert clock.time() >= 0.1
    assert ex.done_count() == 1


async def test_a_deadline_after_the_end_piled_up_behind_a_slow_client_is_dropped() -> (
    None
):
    # The engine finishes while the client is behind; the request timeout then
    # puts its Fail after the End. One drain holds [Delta, Finish, End, Fail]:
    # the stream ends at the End, with [DONE] and no error event. The script
    # is not paced, so that it ends long before the timeout on any machine.
    clock = ManualClock()
    engine = ScriptedEngine(tokens_per_s=float("inf"))
    app = create_app(engine, ServerConfig(request_timeout_s=0.1), clock=clock)
    ex = StalledExchange(app, STREAM, open_for=2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(lambda: engine.stats().finished_requests == 1)
            clock.advance(0.15)  # past the request timeout
            await anyio.lowlevel.checkpoint()
            assert ex.blocked
            ex.gate.set()
    assert "".join(ex.contents()) == DEFAULT_TEXT
    assert not [p for p in ex.payloads() if "error" in p]
    assert ex.events()[-1].data == "[DONE]"
    assert ex.done_count() == 1
    assert _row(app)[0] is EndState.FINISHED


async def test_a_deadline_before_the_end_piled_up_behind_a_slow_client_ends_it() -> (
    None
):
    # The request timeout comes while the client is behind, and the engine's
    # finish after it: one drain holds [Delta, Fail, Delta, Finish, End]; the
    # stream ends at the Fail, with nothing after the error event.
    clock = ManualClock()
    engine = ScriptedEngine(tokens_per_s=100, clock=clock)  # 22 steps: 0.22 s
    app = create_app(engine, ServerConfig(request_timeout_s=0.1), clock=clock)
    ex = StalledExchange(app, STREAM, open_for=2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            finished = lambda: engine.stats().finished_requests == 1  # noqa: E731
            await on_clock(clock, anyio.sleep_forever, 0.01, finished)
            assert ex.blocked
            ex.gate.set()
    payloads = ex.payloads()
    assert ex.only_error()["code"] == "request_timeout"
    text = "".join(ex.contents())
    assert DEFAULT_TEXT.startswith(text)
    assert len(text) < len(DEFAULT_TEXT)
    assert not any(c["finish_reason"] for p in payloads for c in p.get("choices", []))
    assert ex.done_count() == 0
    assert _row(app)[0] is EndState.ERRORED


def test_join_all_deltas_is_join_deltas_folded() -> None:
    usage = Usage(1, 2)
    fragments = [ToolCallFragment(i % 3, None, None, str(i)) for i in range(30)]
    deltas = [
        Delta(0, f"t{i}", None, usage if i == 5 else None, DeltaParts((f,)))
        for i, f in enumerate(fragments)
    ]
    folded = deltas[0]
    for delta in deltas[1:]:
        folded = join_deltas(folded, delta)
    assert join_all_deltas(deltas) == folded
    assert join_all_deltas(deltas[:1]) is deltas[0]
    with pytest.raises(ValueError, match="one choice"):
        join_all_deltas([Delta(0, "a"), Delta(1, "b")])


def test_coalescing_many_tool_call_deltas_is_linear() -> None:
    """30,000 one-fragment deltas merge in one pass: each call's arguments
    joined once (pairwise folding copied every call so far at each step)."""
    events: list[StreamEvent] = [
        Delta(0, "", None, None, DeltaParts((ToolCallFragment(i, "c", "f", "{}"),)))
        for i in range(30_000)
    ]
    (merged,), count = coalesce(events)
    assert count == 29_999
    assert isinstance(merged, Delta)
    assert merged.parts is not None
    assert len(merged.parts.tool_calls) == 30_000
