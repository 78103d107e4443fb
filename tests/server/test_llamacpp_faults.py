"""A decode step that fails inside the real llama.cpp engine, seen through the app.

The server tests elsewhere inject faults with the scripted engine; this one makes
a real ``LlamaCppEngine`` step raise after the first content chunk, so that the
whole path (worker thread -> engine error -> in-band error event) is the real
one, and checks that the next request is served.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette

from sluicegate.core.errors import EngineError
from sluicegate.engines.llamacpp.engine import LlamaCppEngine
from sluicegate.model import default_model_path
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import COMPLETIONS, Exchange, exchange

pytestmark = [pytest.mark.llamacpp, pytest.mark.anyio]

NO_END_TOKENS = {"1": -100, "106": -100, "212": -100}
"""``logit_bias`` that bans Gemma 3's end tokens (``<eos>``, ``<end_of_turn>``,
``</s>``): the requests here sample, and a draw that ended the answer early
(before the fault, or before ``max_tokens``) would fail the test now and then."""
STORY = {
    "prompt": "Tell me a long story.",
    "max_tokens": 512,
    "stream": True,
    "logit_bias": NO_END_TOKENS,
}
HELLO = {"prompt": "Hello", "max_tokens": 4, "logit_bias": NO_END_TOKENS}


@pytest.fixture
async def engine() -> AsyncIterator[LlamaCppEngine]:
    eng = LlamaCppEngine(default_model_path(), n_ctx=2048, n_parallel=2)
    yield eng
    await eng.aclose()


async def _fault_mid_stream(
    engine: LlamaCppEngine, fault: BaseException
) -> tuple[Starlette, Exchange, list[dict[str, Any]]]:
    """Stream STORY through a new app, inject ``fault`` after its first content.

    Returns the app, the ended exchange (status 200 asserted) and its error
    events' payloads.
    """
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, COMPLETIONS, STORY)
    async with anyio.create_task_group() as tg:
        tg.start_soon(ex.run)
        await ex.wait_for(ex.has_content, timeout_s=30)
        engine.inject_fault(fault)
        await ex.wait_for(lambda: ex.returned, timeout_s=30)
    assert ex.status == 200
    errors = [json.loads(e.data) for e in ex.events() if '"error"' in e.data]
    return app, ex, errors


async def test_a_failed_decode_step_is_one_error_event_and_the_next_request_works(
    engine: LlamaCppEngine,
) -> None:
    app, ex, errors = await _fault_mid_stream(
        engine, EngineError("injected decode failure")
    )
    assert len(errors) == 1
    assert errors[0]["error"]["message"]
    assert ex.done_count() == 0
    finishes = [
        c["finish_reason"]
        for p in ex.payloads()
        for c in p.get("choices", [])
        if c.get("finish_reason")
    ]
    assert finishes == []
    stats = engine.stats()
    assert stats.failed_requests == 1
    assert stats.kv_cells_used == 0
    (row,) = app.state.ledger.rows
    assert row.request_id == ex.payloads()[0]["id"]
    assert (row.end_state, row.status) == ("errored", 200)
    assert row.completion_tokens >= len(ex.contents()) >= 1

    after = await exchange(app, COMPLETIONS, HELLO, timeout_s=30)
    assert after.status == 200
    body = json.loads(after.body)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4


class _WorkerKilled(BaseException):
    """Escapes the worker's per-step handler, as an interpreter shutdown would."""


async def test_a_dead_engine_worker_fails_its_streams_in_band_and_says_why(
    engine: LlamaCppEngine,
) -> None:
    app, ex, errors = await _fault_mid_stream(engine, _WorkerKilled("worker killed"))
    assert len(errors) == 1
    assert "the engine stopped" in errors[0]["error"]["message"]
    assert ex.done_count() == 0
    stats = engine.stats()
    assert stats.failure is not None
    assert "worker killed" in stats.failure
    health = Exchange(app, "/health", method="GET")
    with anyio.fail_after(5):
        await health.run()
    assert health.status == 503
    assert json.loads(health.body)["status"] == "engine_failed"
    after = await exchange(app, COMPLETIONS, {"prompt": "Hello", "max_tokens": 4})
    assert after.status == 503
    assert "the engine stopped" in json.loads(after.body)["error"]["message"]
