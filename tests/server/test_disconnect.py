"""A client that leaves aborts its engine sequences, wherever the request is.

Each test drives the app with raw ASGI fakes, makes the client leave, and asserts
that the app returned on its own before a ``move_on_after`` deadline, that the
engine was told to abort (its KV cells freed, its token counter stopped), and that
the ledger says ``aborted``.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import CLIENT_CLOSED
from sluicegate.server.ledger.ledger import LedgerRow

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange

pytestmark = pytest.mark.anyio

DEADLINE_S = 2.0


async def _leave_when(ex: Exchange, ready: Any) -> bool:
    """Run ``ex``, leave once ``ready()``; True if the app returned by itself."""
    with anyio.move_on_after(DEADLINE_S) as deadline:
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(ready)
            ex.leave()
    return not deadline.cancelled_caught and ex.returned


async def _engine_idle(engine: ScriptedEngine) -> None:
    with anyio.fail_after(1):
        while True:
            if not (engine.stats().running or engine.stats().queued):
                return
            await anyio.sleep(0.001)


def _row(app: Starlette) -> LedgerRow:
    rows: list[LedgerRow] = app.state.ledger.rows
    assert len(rows) == 1
    return rows[0]


async def test_leaving_mid_stream_aborts_the_engine_and_stops_the_stream() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert await _leave_when(ex, ex.has_content)
    await _engine_idle(engine)
    stats = engine.stats()
    sequence_id = f"{ex.payloads()[0]['id']}-0"
    assert stats.aborted_ids == (sequence_id,)
    assert stats.kv_cells_used == 0
    generated = stats.generated_tokens
    await anyio.sleep(0.05)
    assert engine.stats().generated_tokens == generated
    assert ex.done_count() == 0
    row = _row(app)
    assert (row.end_state, row.status) == (EndState.ABORTED, 200)
    assert row.completion_tokens >= 1
    assert row.finish_reasons == (None,)


async def test_leaving_during_prefill_aborts_before_any_token() -> None:
    engine = ScriptedEngine(prefill_delay_s=30)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert await _leave_when(ex, lambda: ex.status == 200)
    await _engine_idle(engine)
    stats = engine.stats()
    assert len(stats.aborted_ids) == 1
    assert (stats.generated_tokens, stats.kv_cells_used) == (0, 0)
    row = _row(app)
    assert row.end_state is EndState.ABORTED
    assert row.first_token_at is None
    assert row.completion_tokens == 0


async def test_leaving_during_the_queue_wait_removes_the_request() -> None:
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1)
    engine.generate(GenerateRequest("hog", (1, 2), SamplingParams(10)))
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, COMPLETIONS, {"prompt": "Hi", "n": 2, "stream": True})
    assert await _leave_when(ex, lambda: ex.status == 200)
    stats = engine.stats()
    assert stats.queued == 0
    assert stats.running_ids == ("hog",)
    assert len(stats.aborted_ids) == 2
    assert _row(app).end_state is EndState.ABORTED
    await engine.aclose()


async def test_leaving_a_non_streamed_request_aborts_the_engine() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, {"messages": HELLO})
    assert await _leave_when(ex, lambda: engine.stats().generated_tokens >= 3)
    await _engine_idle(engine)
    assert ex.messages == []
    assert len(engine.stats().aborted_ids) == 1
    row = _row(app)
    assert (row.end_state, row.status) == (EndState.ABORTED, CLIENT_CLOSED)
    assert row.completion_tokens >= 3


async def test_leaving_a_non_streamed_request_during_prefill_aborts_it() -> None:
    engine = ScriptedEngine(prefill_delay_s=30)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, COMPLETIONS, {"prompt": "Hi"})
    assert await _leave_when(ex, lambda: engine.stats().running == 1)
    await _engine_idle(engine)
    assert ex.messages == []
    assert engine.stats().generated_tokens == 0
    assert _row(app).end_state is EndState.ABORTED


async def test_leaving_while_sending_the_body_is_recorded_as_aborted() -> None:
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, chunks=[b'{"messages": ', b"[]}"])
    ex.leave()
    with anyio.fail_after(DEADLINE_S):
        await ex.run()
    assert ex.messages == []
    row = _row(app)
    assert (row.end_state, row.status) == (EndState.ABORTED, CLIENT_CLOSED)
    assert engine.stats().prompt_tokens == 0


async def test_a_broken_connection_while_writing_aborts_the_engine() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True}, fail_send_after=3)
    with anyio.fail_after(DEADLINE_S):
        await ex.run()
    await _engine_idle(engine)
    assert len(engine.stats().aborted_ids) == 1
    assert _row(app).end_state is EndState.ABORTED
    assert not ex.completed
