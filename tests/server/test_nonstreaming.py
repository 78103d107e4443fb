"""Non-streamed answers: the same pipeline, one JSON body, usage included."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio


async def test_chat_completion_object_with_usage(
    client: httpx.AsyncClient, app: Starlette
) -> None:
    response = await client.post(CHAT, json={"messages": HELLO})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["id"].startswith("chatcmpl-")
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": DEFAULT_TEXT},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    usage = body["usage"]
    ledger: Ledger = app.state.ledger
    row = ledger.rows[-1]
    assert row.request_id == body["id"]
    assert (row.end_state, row.status) == (EndState.FINISHED, 200)
    assert usage["prompt_tokens"] == row.prompt_tokens
    assert usage["completion_tokens"] == row.completion_tokens
    assert usage["total_tokens"] == row.prompt_tokens + row.completion_tokens


async def test_streamed_and_non_streamed_agree(
    client: httpx.AsyncClient, app: Starlette
) -> None:
    request = {"prompt": "Hi", "stop": [" fox"], "max_tokens": 30}
    whole = (await client.post(COMPLETIONS, json=request)).json()
    streamed = await exchange(
        app,
        COMPLETIONS,
        {**request, "stream": True, "stream_options": {"include_usage": True}},
    )
    assert "".join(streamed.contents()) == whole["choices"][0]["text"]
    assert whole["choices"][0]["text"] == DEFAULT_TEXT.split(" fox")[0]
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert streamed.payloads()[-1]["usage"] == whole["usage"]


async def test_token_id_prompt_two_choices_and_length(
    client: httpx.AsyncClient,
) -> None:
    body = {"prompt": [5, 6, 7], "n": 2, "max_tokens": 3}
    response = await client.post(COMPLETIONS, json=body)
    payload = response.json()
    assert payload["object"] == "text_completion"
    assert [c["index"] for c in payload["choices"]] == [0, 1]
    assert [c["finish_reason"] for c in payload["choices"]] == ["length"] * 2
    assert payload["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 6,
        "total_tokens": 9,
    }


async def test_engine_failure_is_500_in_the_error_shape() -> None:
    engine = ScriptedEngine(fail_at_step=2)
    app = create_app(engine, ServerConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(CHAT, json={"messages": HELLO})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "engine_error"
    assert "step 2" in error["message"]
    ledger: Ledger = app.state.ledger
    row = ledger.rows[-1]
    assert (row.end_state, row.status) == (EndState.ERRORED, 500)
    assert row.completion_tokens == 2
    assert row.finish_reasons == (None,)


async def test_default_max_tokens_fills_the_context_window() -> None:
    engine = ScriptedEngine([20] * 100, context_length=30)
    app = create_app(engine, ServerConfig())
    ex = await exchange(app, COMPLETIONS, {"prompt": [1, 2, 3, 4, 5]})
    body = json.loads(ex.body)
    assert body["usage"]["completion_tokens"] == 25
    assert body["choices"][0]["finish_reason"] == "length"
    ledger: Ledger = app.state.ledger
    assert ledger.rows[-1].finish_reasons == (FinishReason.LENGTH,)


async def test_max_completion_tokens_wins_over_max_tokens(
    client: httpx.AsyncClient,
) -> None:
    body = {"messages": HELLO, "max_tokens": 9, "max_completion_tokens": 2}
    response = await client.post(CHAT, json=body)
    assert response.json()["usage"]["completion_tokens"] == 2
    body = {"messages": HELLO, "max_tokens": 3, "stop": None}
    response = await client.post(CHAT, json=body)
    assert response.json()["usage"]["completion_tokens"] == 3


async def test_a_connection_broken_while_sending_the_answer_is_aborted() -> None:
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    ex = Exchange(app, COMPLETIONS, {"prompt": "Hi"}, fail_send_after=0)
    await ex.run()
    assert ex.body == b""
    ledger: Ledger = app.state.ledger
    row = ledger.rows[-1]
    assert ledger.find(row.request_id) is row
    assert (row.end_state, row.status) == (EndState.ABORTED, 200)
    assert row.finish_reasons == (FinishReason.STOP,)


class _BuggyEngine(ScriptedEngine):
    """``generate`` fails with a plain bug, before any byte."""

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        raise RuntimeError("bug in the engine adapter")


async def test_a_bug_before_the_first_byte_is_a_recorded_500() -> None:
    app = create_app(_BuggyEngine(), ServerConfig())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(CHAT, json={"messages": HELLO, "stream": True})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error"
    assert "adapter" not in error["message"]
    ledger: Ledger = app.state.ledger
    assert (ledger.rows[-1].end_state, ledger.rows[-1].status) == (
        EndState.ERRORED,
        500,
    )


async def test_a_bug_in_a_messages_request_is_a_500_in_anthropics_shape() -> None:
    """It was OpenAI's ``{"error": {...}}``, which the anthropic SDK does not read."""
    app = create_app(_BuggyEngine(), ServerConfig())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    body = {"model": "default", "max_tokens": 5, "messages": HELLO}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post("/v1/messages", json=body)
    assert response.status_code == 500
    assert response.headers["connection"] == "close"  # uvicorn closes it
    assert response.json()["type"] == "error"
    assert response.json()["error"]["type"] == "api_error"
