"""Timeouts and the graceful drain end a response in band and abort the engine.

The timeouts run on a ``ManualClock`` shared by the app and its scripted engine:
the tests step time instead of sleeping against a limit.
"""

from __future__ import annotations

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.streaming.shutdown import Drain

from .asgi import CHAT, HELLO, Exchange, exchange, on_clock

pytestmark = pytest.mark.anyio

STREAM = {"messages": HELLO, "stream": True}


def _row_state(app: Starlette) -> EndState:
    ledger: Ledger = app.state.ledger
    return ledger.rows[-1].end_state


async def _engine_idle(engine: ScriptedEngine) -> None:
    with anyio.fail_after(2):
        while True:
            if not (engine.stats().running or engine.stats().queued):
                break
            await anyio.sleep(0.005)
    assert engine.stats().kv_cells_used == 0


def _error_code(ex: Exchange) -> str:
    errors = [p["error"] for p in ex.payloads() if "error" in p]
    assert len(errors) == 1
    assert set(errors[0]) >= {"message", "type", "code"}
    assert ex.done_count() == 0
    return str(errors[0]["code"])


async def test_no_first_token_in_time_is_an_in_band_error_and_an_abort() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=30, clock=clock)
    app = create_app(engine, ServerConfig(first_token_timeout_s=0.2), clock=clock)
    ex = Exchange(app, CHAT, STREAM)
    await on_clock(clock, ex.run, 0.05)
    assert ex.status == 200
    assert clock.time() < 1  # the limit ended it, not the prefill
    assert _error_code(ex) == "first_token_timeout"
    await _engine_idle(engine)
    assert engine.stats().aborted_requests == 1
    assert _row_state(app) is EndState.ERRORED


async def test_a_request_past_its_total_time_ends_with_request_timeout() -> None:
    # The first token comes after 5 ms, before the first-token limit, which
    # comes before the total one: it would end the stream first had the first
    # token not disarmed it.
    clock = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200, clock=clock)
    config = ServerConfig(first_token_timeout_s=0.3, request_timeout_s=0.6)
    app = create_app(engine, config, clock=clock)
    ex = Exchange(app, CHAT, STREAM)
    await on_clock(clock, ex.run, 0.005)
    assert ex.has_content()
    assert 0.6 <= clock.time() < 0.7
    assert _error_code(ex) == "request_timeout"
    await _engine_idle(engine)
    assert _row_state(app) is EndState.ERRORED


async def test_a_non_streaming_timeout_is_a_504_in_openai_shape() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=30, clock=clock)
    app = create_app(engine, ServerConfig(request_timeout_s=0.2), clock=clock)
    transport = httpx.ASGITransport(app=app)
    responses: list[httpx.Response] = []
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

        async def post() -> None:
            responses.append(await client.post(CHAT, json={"messages": HELLO}))

        await on_clock(clock, post, 0.05)
    [response] = responses
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    await _engine_idle(engine)


async def test_drain_lets_short_streams_finish_and_ends_the_rest_in_band() -> None:
    engine = ScriptedEngine(tokens_per_s=2000)
    slow = ScriptedEngine(never_finishes=True, tokens_per_s=100)
    app = create_app(engine, ServerConfig())
    stuck_app = create_app(slow, ServerConfig())
    quick = Exchange(app, CHAT, STREAM)
    endless = Exchange(stuck_app, CHAT, STREAM)
    drain: Drain = stuck_app.state.drain
    drain.timers = clock = ManualClock()
    async with anyio.create_task_group() as tg:
        tg.start_soon(quick.run)
        tg.start_soon(endless.run)
        await endless.wait_for(endless.has_content)
        tg.start_soon(app.state.drain.run, 1.0)
        tg.start_soon(drain.run, 30)
        await endless.wait_for(lambda: drain.draining)
        assert not endless.completed  # the grace period has not passed
        clock.advance(30)
        with anyio.fail_after(3):
            await endless.wait_for(lambda: drain.done)
    assert drain.done
    assert "".join(quick.contents()) == DEFAULT_TEXT
    assert quick.done_count() == 1
    assert _error_code(endless) == "server_shutdown"
    assert endless.completed
    await _engine_idle(slow)
    assert _row_state(stuck_app) is EndState.ERRORED
    late = await exchange(stuck_app, CHAT, STREAM)
    assert late.status == 503
    assert dict(late.headers)[b"retry-after"] == b"1"
