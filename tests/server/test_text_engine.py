"""The server in front of an engine that takes and yields text (an upstream server).

No token work is done for it: the prompt goes to the engine in the API's terms
(``TextPrompt``), the engine counts the prompt's tokens, and an engine that
refuses with a status of its own (``AcceptingOutputs.accepted``) has that status
answered before any byte.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineRefused, EngineUnavailable
from sluicegate.core.events import Usage
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import Capabilities, GenerateRequest
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted.engine import DEFAULT_TEXT
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from tests.server.asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio


class _Recording(ScriptedTextEngine):
    """Remembers every request it was given."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.requests: list[GenerateRequest] = []

    def generate(self, request: GenerateRequest) -> SequenceOutputs[Any]:
        self.requests.append(request)
        return super().generate(request)


class _Refusing(ScriptedTextEngine):
    """Refuses every sequence after ``generate``, as an upstream's status does;
    with ``error=None`` it never accepts (an upstream that never answers)."""

    def __init__(self, error: BaseException | None, **options: Any) -> None:
        super().__init__(**options)
        self.error = error
        self.generated: list[str] = []
        self.aborted: list[str] = []

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(listenable=True, late_acceptance=True)

    def generate(self, request: GenerateRequest) -> Any:
        self.generated.append(request.request_id)
        return _Pending(super().generate(request), self.error)

    def abort(self, request_id: str, *, stopped: bool = False) -> None:
        self.aborted.append(request_id)
        super().abort(request_id, stopped=stopped)


class _Pending:
    """Outputs that are also ``AcceptingOutputs``: ``accepted()`` raises ``error``
    (or never returns when it is ``None``)."""

    def __init__(self, outputs: SequenceOutputs[Any], error: BaseException | None):
        self._outputs = outputs
        self._error = error

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outputs, name)

    def __aiter__(self) -> Any:
        return self._outputs.__aiter__()

    async def accepted(self) -> Usage | None:
        if self._error is None:
            await asyncio.Event().wait()  # never set: cancelled by the server
        assert self._error is not None
        raise self._error

    async def responded(self) -> None:
        await asyncio.Event().wait()  # never: refused, or waiting, before a 200


def _app(engine: ScriptedTextEngine, **config: Any) -> Any:
    return create_app(engine, ServerConfig(**config))


async def test_a_chat_prompt_goes_to_the_engine_as_messages_not_tokens() -> None:
    engine = _Recording(tokens_per_s=10_000)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
    ]
    body = {
        "messages": messages,
        "stop": ["lazy"],
        "max_tokens": 40,
        "n": 2,
        "temperature": 0.25,
        "top_k": 5,
    }
    ex = await exchange(_app(engine), CHAT, {**body, "seed": 7, "stream": True})
    assert ex.status == 200
    assert len(engine.requests) == 2
    first, second = engine.requests
    assert first.prompt_token_ids == ()
    assert first.text_prompt == second.text_prompt
    prompt = first.text_prompt
    assert prompt is not None
    assert prompt.endpoint is Endpoint.CHAT
    assert [m["role"] for m in prompt.messages] == ["system", "user"]
    assert prompt.messages[1]["content"] == "Hi"  # text parts joined
    assert prompt.stop == ("lazy",)
    assert prompt.max_tokens == 40
    assert (first.params.seed, second.params.seed) == (7, 8)
    assert prompt.extra == {"temperature": 0.25, "top_k": 5}  # only what was set


async def test_max_tokens_left_to_the_engine_when_the_client_sets_none() -> None:
    engine = _Recording(tokens_per_s=10_000)
    await exchange(_app(engine), CHAT, {"messages": HELLO})
    prompt = engine.requests[0].text_prompt
    assert prompt is not None
    assert prompt.max_tokens is None


async def test_usage_counts_the_prompt_tokens_the_engine_reports() -> None:
    engine = _Recording(tokens_per_s=10_000)
    body = {
        "messages": HELLO,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    ex = await exchange(_app(engine), CHAT, body)
    usage = ex.payloads()[-1]["usage"]
    prompt = engine.requests[0].text_prompt
    assert prompt is not None
    expected = len(
        engine.tokenizer.encode("user: Hi", add_special=True, parse_special=False)
    )
    assert usage["prompt_tokens"] == expected  # one prompt, counted once
    texts = ["", ""]
    for payload in ex.payloads():
        for choice in payload["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == [DEFAULT_TEXT, DEFAULT_TEXT]


async def test_a_completions_batch_counts_each_prompt_once() -> None:
    engine = _Recording(tokens_per_s=10_000)
    body = {"prompt": [[5, 6], [5, 6, 7]], "n": 2, "max_tokens": 3}
    app = _app(engine)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(COMPLETIONS, json=body)
    assert response.status_code == 200
    prompts = [r.text_prompt.prompt for r in engine.requests if r.text_prompt]
    assert prompts == [(5, 6), (5, 6), (5, 6, 7), (5, 6, 7)]
    assert response.json()["usage"]["prompt_tokens"] == 2 + 3
    assert response.json()["usage"]["completion_tokens"] == 4 * 3


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (CHAT, {"messages": HELLO, "logprobs": True}, "logprobs"),
        (COMPLETIONS, {"prompt": "Hi", "logprobs": 2}, "logprobs"),
        (CHAT, {"messages": HELLO, "stop_token_ids": [3]}, "stop_token_ids"),
        (COMPLETIONS, {"prompt": [1, 2], "echo": True}, "prompt"),
    ],
)
async def test_what_needs_the_vocabulary_is_refused_before_any_byte(
    path: str, body: dict[str, Any], param: str
) -> None:
    engine = _Recording()
    ex = await exchange(_app(engine), path, {**body, "stream": True})
    assert ex.status == 400
    assert json.loads(ex.body)["error"]["param"] == param
    assert engine.requests == []


async def test_an_echo_of_a_text_prompt_still_works() -> None:
    engine = _Recording(tokens_per_s=10_000)
    body = {"prompt": "Once", "echo": True, "max_tokens": 2, "stream": True}
    ex = await exchange(_app(engine), COMPLETIONS, body)
    assert ex.contents()[0] == "Once"


@pytest.mark.parametrize("stream", [True, False])
async def test_an_engine_refusal_is_the_status_with_its_retry_after(
    stream: bool,
) -> None:
    refusal = EngineRefused(
        "Rate limit reached upstream", 429, retry_after_s=2.5, code="rate_limited"
    )
    engine = _Refusing(refusal)
    app = _app(engine)
    ex = await exchange(app, CHAT, {"messages": HELLO, "n": 2, "stream": stream})
    assert ex.status == 429
    assert (b"retry-after", b"3") in ex.headers
    error = json.loads(ex.body)["error"]
    assert error["message"] == "Rate limit reached upstream"
    assert error["code"] == "rate_limited"
    assert error["type"] == "invalid_request_error"
    assert b"data:" not in ex.body
    assert sorted(engine.aborted) == sorted(engine.generated)
    row = app.state.ledger.rows[-1]
    assert (row.end_state, row.status) == (EndState.REJECTED, 429)
    assert engine.stats().running == 0


async def test_an_engine_that_cannot_take_it_after_generate_is_a_503() -> None:
    app = _app(_Refusing(EngineUnavailable("every upstream is down")), retry_after_s=4)
    ex = await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert ex.status == 503
    assert (b"retry-after", b"4") in ex.headers


async def test_a_refusal_as_a_context_overflow_keeps_its_param() -> None:
    refusal = EngineRefused(
        "This model's maximum context length is 2048 tokens",
        400,
        code="context_length_exceeded",
        param="messages",
    )
    ex = await exchange(_app(_Refusing(refusal)), CHAT, {"messages": HELLO})
    assert ex.status == 400
    error = json.loads(ex.body)["error"]
    assert (error["param"], error["code"]) == ("messages", "context_length_exceeded")


async def test_a_client_gone_before_the_engine_accepted_aborts_it() -> None:
    engine = _Refusing(None)
    app = _app(engine)
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(ex.run())
        await ex.wait_for(lambda: engine.stats().running + engine.stats().queued > 0)
        ex.leave()
    assert ex.status is None  # nothing was sent
    assert len(engine.aborted) == 1
    row = app.state.ledger.rows[-1]
    assert (row.end_state, row.status) == (EndState.ABORTED, 499)
    await ex.wait_for(lambda: engine.stats().running + engine.stats().queued == 0)


async def test_the_ledger_marks_usage_estimated_when_the_engine_never_counted_it() -> (
    None
):
    engine = ScriptedTextEngine(tokens_per_s=10_000)
    app = _app(engine)
    await exchange(app, CHAT, {"messages": HELLO, "stream": True})
    assert not app.state.ledger.rows[-1].usage_estimated
    slow = ScriptedTextEngine(tokens_per_s=50, never_finishes=True)
    app = _app(slow)
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(ex.run())
        await ex.wait_for(ex.has_content)
        ex.leave()
    row = app.state.ledger.rows[-1]
    assert (row.end_state, row.usage_estimated) == (EndState.ABORTED, True)
    assert row.completion_tokens >= 1
