"""Every refusal is decided before the first byte, in the OpenAI error shape.

These responses are not streamed, so ``httpx.ASGITransport`` (which buffers whole
bodies) is enough.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

import sluicegate
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import RequestError
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.apis.messages_api import to_chat_request
from sluicegate.server.apis.openapi import openapi_document
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger
from sluicegate.server.schemas.anthropic_messages import (
    MAX_BLOCKS,
    MessagesRequest,
    parse_messages_request,
)
from sluicegate.server.schemas.chat import MAX_STOP_CHARS, MAX_STOP_STRINGS
from sluicegate.server.schemas.param_errors import validated
from sluicegate.server.schemas.parse import (
    parse_chat_request,
    parse_completion_request,
)

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange

pytestmark = pytest.mark.anyio


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(
    ("extra", "param", "fragments"),
    [
        ({"n": 0}, "n", ["greater than or equal to 1", "got 0"]),
        ({"n": 17}, "n", ["at most 16", "got 17"]),
        ({"n": "2"}, "n", ["valid integer", "got '2'"]),
        ({"max_tokens": -1}, "max_tokens", ["greater than or equal to 1", "got -1"]),
        ({"max_completion_tokens": 0}, "max_completion_tokens", ["got 0"]),
        ({"temperature": 5}, "temperature", ["less than or equal to 2", "got 5"]),
        ({"top_p": 0}, "top_p", ["greater than 0", "got 0"]),
        ({"presence_penalty": -3}, "presence_penalty", ["-2", "got -3"]),
        ({"stream": "yes"}, "stream", ["valid boolean", "got 'yes'"]),
        ({"stop": [""]}, "stop", ["must not be empty"]),
        ({"stop": ["x"] * 17}, "stop", [f"at most {MAX_STOP_STRINGS}", "17"]),
        (
            {"stop": ["END", "x" * (MAX_STOP_CHARS + 1)]},
            "stop",
            [
                f"stop[1] has {MAX_STOP_CHARS + 1} characters",
                f"at most {MAX_STOP_CHARS}",
            ],
        ),
        ({"stop": [1]}, "stop[0]", ["valid string", "got 1"]),
        ({"messages": []}, "messages", ["at least 1", "got []"]),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", []),
        ({"messages": [{"role": "user"}]}, "messages[0].content", ["Missing"]),
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages[0].content",
            ["needs a string 'text'"],
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content",
            ["only text parts", "image_url"],
        ),
        ({"stream_options": {"include_usage": True}}, "stream_options", ["stream"]),
        (
            {"tools": [{"type": "function"}]},
            "tools[0].function",
            ["Missing"],
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
            ["1 to 64 characters", "'a b'"],
        ),
        ({"tool_choice": "required"}, "tool_choice", ["only allowed when 'tools'"]),
        (
            {"tool_choice": {"type": "function", "function": {"name": "f"}}},
            "tool_choice",
            ["{'type': 'function', 'function': {'name': 'f'}} is only allowed"],
        ),
        (
            {"messages": [{"role": "tool", "content": "1"}]},
            "messages[0]",
            ["tool_call_id"],
        ),
        (
            {"messages": [{"role": "user", "content": None}]},
            "messages[0].content",
            ["Missing"],
        ),
        ({"logprobs": "yes"}, "logprobs", ["valid boolean", "got 'yes'"]),
        (
            {"logprobs": True, "top_logprobs": 21},
            "top_logprobs",
            ["less than or equal to 20", "got 21"],
        ),
        (
            {"top_logprobs": 2},
            "top_logprobs",
            [
                "top_logprobs is only allowed when logprobs is true; got "
                "top_logprobs=2 and logprobs=False"
            ],
        ),
        (
            {"logit_bias": {"5": 150}},
            "logit_bias",
            [
                "Invalid value for 'logit_bias': the bias of token 5 is 150.0 but "
                "must lie in [-100, 100]; got {'5': 150}"
            ],
        ),
        (
            {"logit_bias": {"the": 1}},
            "logit_bias",
            ["keys must be token ids (decimal strings); 'the'"],
        ),
        (
            {"logit_bias": {"999999": -100}},
            "logit_bias",
            [
                "Invalid value for 'logit_bias': token ids must be in [0, 293); "
                "got 999999"
            ],
        ),
        (
            {"stop_token_ids": [3, 999999]},
            "stop_token_ids",
            [
                "Invalid value for 'stop_token_ids': token ids must be in [0, 293); "
                "got 999999"
            ],
        ),
        ({"top_k": -2}, "top_k", ["greater than or equal to -1", "got -2"]),
        ({"min_p": 1.5}, "min_p", ["less than or equal to 1", "got 1.5"]),
        ({"repetition_penalty": 0}, "repetition_penalty", ["greater than 0"]),
        ({"ignore_eos": 1}, "ignore_eos", ["valid boolean", "got 1"]),
        (
            {"max_completion_tokens": 5000},
            "max_completion_tokens",
            [
                "max_completion_tokens is 5000 but the context window is 4096 "
                "tokens and the prompt has 10 tokens: at most 4086 fit"
            ],
        ),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format",
            ["needs a 'json_schema' object"],
        ),
    ],
)
async def test_invalid_chat_parameters_are_400_naming_param_limit_and_value(
    client: httpx.AsyncClient,
    app: Starlette,
    extra: dict[str, Any],
    param: str,
    fragments: list[str],
) -> None:
    response = await client.post(CHAT, json={"messages": HELLO, **extra})
    error = _error(response, 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    for fragment in fragments:
        assert fragment in error["message"]
    ledger: Ledger = app.state.ledger
    assert ledger.rows[-1].end_state is EndState.REJECTED
    assert ledger.rows[-1].status == 400


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": ["a", [5]]}, "prompt", "a batch mixes strings and token id"),
        ({"prompt": [[5], []]}, "prompt", "prompt[1] is empty; got [[5], []]"),
        ({"prompt": 5}, "prompt", "a string, a list of token ids, a list of"),
        ({"prompt": [1, 99999]}, "prompt", "got 99999"),
        (
            {"prompt": [[5], [1, 99999]]},
            "prompt[1]",
            "Invalid value for 'prompt[1]': token ids must be in [0, 293); got 99999",
        ),
        (
            {"prompt": ["a"] * 5, "n": 4},
            "n",
            "Invalid value for 'n': 5 prompts x n=4 is 20 choices, at most 16",
        ),
        (
            {"prompt": "x", "suffix": "y"},
            "suffix",
            "The parameter 'suffix' is not supported yet (insertion (fill in the "
            "middle) is not built); got 'y'",
        ),
        ({"prompt": "x", "best_of": 3}, "best_of", "not supported yet"),
        (
            {"prompt": "x", "echo": True, "logprobs": 2},
            "echo",
            "echo with logprobs is not supported yet (prompt tokens carry no "
            "logprobs here); got echo=True and logprobs=2",
        ),
        ({"prompt": "x", "logprobs": 21}, "logprobs", "less than or equal to 20"),
        (
            {"prompt": "x", "max_tokens": 5000},
            "max_tokens",
            "max_tokens is 5000 but the context window is 4096 tokens and the "
            "prompt has 2 tokens: at most 4094 fit",
        ),
    ],
)
async def test_invalid_completion_parameters_are_400(
    client: httpx.AsyncClient, extra: dict[str, Any], param: str, fragment: str
) -> None:
    error = _error(await client.post(COMPLETIONS, json=extra), 400)
    assert error["param"] == param
    assert fragment in error["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_both_endpoints_take_max_completion_tokens_from_their_shared_fields(
    path: str,
) -> None:
    """One field of the shared base, beside ``max_tokens`` in /openapi.json; a
    body wrong in it and in a field of the endpoint's own names it first."""
    paths = openapi_document()["paths"]
    body = paths[path]["post"]["requestBody"]["content"]["application/json"]
    names = list(body["schema"]["properties"])
    assert names[names.index("max_tokens") + 1] == "max_completion_tokens"
    parse = parse_chat_request if path == CHAT else parse_completion_request
    with pytest.raises(RequestError) as refused:
        parse({"messages": [], "prompt": "", "max_completion_tokens": 0})
    assert refused.value.param == "max_completion_tokens"


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b'{"messages": [', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object; got list (array)"),
        (b'"text"', "got str (string)"),
        (b"null", "got NoneType (null)"),
    ],
)
async def test_a_body_that_is_not_a_json_object_is_400(
    client: httpx.AsyncClient, body: bytes, fragment: str
) -> None:
    headers = {"content-type": "application/json"}
    response = await client.post(CHAT, content=body, headers=headers)
    error = _error(response, 400)
    assert fragment in error["message"]
    assert error["code"] == "invalid_json"


async def test_missing_messages_is_400_naming_it(client: httpx.AsyncClient) -> None:
    error = _error(await client.post(CHAT, json={}), 400)
    assert error["param"] == "messages"
    assert error["message"] == "Missing required parameter: 'messages'"


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    response = await client.post(CHAT, json={"messages": HELLO, "model": "gpt-9"})
    error = _error(response, 404)
    assert error["param"] == "model"
    assert error["code"] == "model_not_found"
    assert "'gpt-9'" in error["message"]


@pytest.mark.parametrize("model", [None, "scripted", "default"])
async def test_served_model_id_alias_or_none_all_answer_with_the_served_id(
    client: httpx.AsyncClient, model: str | None
) -> None:
    body: dict[str, Any] = {"messages": HELLO, "max_tokens": 2}
    if model is not None:
        body["model"] = model
    response = await client.post(CHAT, json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "scripted"


async def test_prompt_longer_than_the_context_is_400_with_limit_and_length() -> None:
    engine = ScriptedEngine(context_length=64)
    app = create_app(engine, ServerConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        long = {"messages": [{"role": "user", "content": "z" * 100}], "stream": True}
        error = _error(await client.post(CHAT, json=long), 400)
        assert "context window is 64 tokens" in error["message"]
        assert "the prompt has 109 tokens" in error["message"]
        assert error["code"] == "context_length_exceeded"

        fits = {"messages": HELLO, "max_tokens": 100, "stream": True}
        error = _error(await client.post(CHAT, json=fits), 400)
        assert error["param"] == "max_tokens"
        assert error["message"] == (
            "max_tokens is 100 but the context window is 64 tokens and the prompt "
            "has 10 tokens: at most 54 fit"
        )
        error = _error(await client.post(COMPLETIONS, json={"prompt": "z" * 70}), 400)
        assert error["param"] == "prompt"
    assert engine.stats().prompt_tokens == 0


async def test_body_over_the_limit_is_413_by_content_length() -> None:
    app = create_app(ScriptedEngine(), ServerConfig(max_body_bytes=100))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        body = {"messages": [{"role": "user", "content": "x" * 200}]}
        error = _error(await client.post(CHAT, json=body), 413)
    assert "the limit is 100" in error["message"]
    assert error["code"] == "request_too_large"
    ledger: Ledger = app.state.ledger
    assert (ledger.rows[-1].status, ledger.rows[-1].end_state) == (
        413,
        EndState.REJECTED,
    )


async def test_body_over_the_limit_is_413_while_reading_without_length() -> None:
    app = create_app(ScriptedEngine(), ServerConfig(max_body_bytes=100))
    pieces = [b'{"messages": [{"role": "user", "content": "', b"x" * 60, b"x" * 60]
    ex = Exchange(app, CHAT, chunks=pieces)
    await ex.run()
    assert ex.status == 413
    message = json.loads(ex.body)["error"]["message"]
    assert "has 103 bytes; the limit is 100" in message


async def test_invalid_content_length_is_400(app: Starlette) -> None:
    length = [(b"content-length", b"12abc")]
    ex = Exchange(app, CHAT, chunks=[b"{}"], extra_headers=length)
    await ex.run()
    assert ex.status == 400
    assert "Invalid Content-Length header: '12abc'" in ex.body.decode()


async def test_full_engine_queue_is_503_with_retry_after() -> None:
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1, max_queued=0)
    engine.generate(GenerateRequest("hog", (1, 2), SamplingParams(10)))
    app = create_app(engine, ServerConfig())
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        response = await client.post(CHAT, json={"messages": HELLO, "stream": True})
    error = _error(response, 503)
    assert response.headers["retry-after"] == "1"
    assert error["code"] == "engine_unavailable"
    ledger: Ledger = app.state.ledger
    assert ledger.rows[-1].end_state is EndState.REJECTED
    await engine.aclose()


async def test_unknown_fields_are_ignored_and_logged_once(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"messages": HELLO, "max_tokens": 2, "frobnicate_level_xyz": 3}
    with caplog.at_level(logging.INFO, logger="sluicegate.server.schemas.parse"):
        first = await client.post(CHAT, json=body)
        second = await client.post(CHAT, json=body)
    assert (first.status_code, second.status_code) == (200, 200)
    assert caplog.text.count("frobnicate_level_xyz") == 1


async def test_unknown_path_and_wrong_method_use_the_error_shape(
    client: httpx.AsyncClient,
) -> None:
    error = _error(await client.get("/v1/nothing"), 404)
    assert error["message"] == "Invalid URL (GET /v1/nothing)"
    response = await client.get(CHAT)
    error = _error(response, 405)
    assert "GET" in error["message"]
    assert response.headers["allow"] == "POST"


async def test_a_messages_string_content_is_not_held_to_the_block_count() -> None:
    """``MAX_BLOCKS`` bounds a message's content blocks, not the characters of
    a string content: 2,000 characters are counted, 1,025 blocks refused."""
    app = create_app(ScriptedEngine(), ServerConfig())
    transport = httpx.ASGITransport(app=app)
    count = "/v1/messages/count_tokens"
    text = "The keeper lit the lamp. " * 80
    blocks = [{"type": "text", "text": "x"}] * (MAX_BLOCKS + 1)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        counted, refused = [
            await client.post(
                count,
                json={
                    "model": "scripted",
                    "messages": [{"role": "user", "content": c}],
                },
            )
            for c in (text, blocks)
        ]
    assert len(text) == 2000
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] >= 80, counted.text
    assert refused.status_code == 400, refused.text
    assert "1024" in refused.json()["error"]["message"], refused.text


def test_a_messages_forced_tool_choice_without_tools_is_400() -> None:
    """Anthropic's API refuses it; it was dropped, and the model answered in
    words where the client forced a call."""
    tool = {"name": "ls", "input_schema": {}}
    for choice in ({"type": "any"}, {"type": "tool", "name": "ls"}):
        body = {"model": "m", "max_tokens": 5, "messages": HELLO, "tool_choice": choice}
        with pytest.raises(RequestError) as caught:
            to_chat_request(parse_messages_request(body))
        assert caught.value.param == "tool_choice"
        chat = to_chat_request(parse_messages_request({**body, "tools": [tool]})).chat
        assert chat.tool_choice is not None
    for choice in ({"type": "auto"}, {"type": "none"}):  # nothing forced: taken
        body = {"model": "m", "max_tokens": 5, "messages": HELLO, "tool_choice": choice}
        assert to_chat_request(parse_messages_request(body)).chat.tool_choice is None


def test_one_helper_validates_every_apis_body_and_names_the_parameter() -> None:
    """Chat, Responses and Messages each validated a body against its model and
    turned pydantic's error into the 400 by hand; ``validated`` is the one
    place now: ``null`` is "not given", the error names its parameter."""
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    request = validated(MessagesRequest, {**body, "max_tokens": None, "top_k": 2})
    assert (request.max_tokens, request.top_k) == (None, 2)
    with pytest.raises(RequestError) as bad:
        validated(MessagesRequest, {**body, "messages": [{"role": "robot"}]})
    assert bad.value.param == "messages[0].role"
    src = Path(sluicegate.__file__).parent
    handlers = sorted(
        path.relative_to(src).as_posix()
        for path in src.rglob("*.py")
        if "except ValidationError" in path.read_text()
    )
    assert handlers == ["server/schemas/param_errors.py"]
