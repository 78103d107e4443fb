"""Anthropic's Messages API on the real model, through the official anthropic SDK.

The same core as the chat endpoints writes it: streamed and whole answers
agree, stop strings are held back and named, tool calls arrive as tool_use
blocks, errors come in Anthropic's shape, a client that leaves aborts the
engine, and the scripted engine's faults and long prefills give the Messages
API's own error event and pings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import httpx
import pytest

from .servers import ServerProcess, StartServer
from .test_disconnect import assert_aborted, new_running_id
from .wire import NO_END_TOKENS, RawExchange, engine_stats

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def _body(error: anthropic.APIStatusError) -> dict[str, Any]:
    """The error's JSON body."""
    return cast(dict[str, Any], error.body)


KEY = "sk-messages-test"
GREEDY = {"temperature": 0}
"""The SDK has no ``temperature`` argument: it goes in the body as is."""
HELLO: Any = [{"role": "user", "content": "Say hello in French."}]
WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def claude(base_url: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0)
    yield client
    client.close()


def _blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks, tool-use ids left out (each answer draws its own)."""
    out = []
    for block in message.content:
        shape = block.model_dump(exclude_none=True)
        shape.pop("id", None)
        out.append(shape)
    return out


def test_a_stream_has_anthropic_events_in_order_and_equals_the_whole_message(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    kw: Any = {"model": model_id, "max_tokens": 16, "messages": HELLO}
    whole = claude.messages.create(**kw, extra_body=GREEDY)
    events = list(claude.messages.create(**kw, stream=True, extra_body=GREEDY))
    kinds = [event.type for event in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    start = events[0].message
    assert start.id.startswith("msg_")
    assert start.content == []
    assert start.usage.input_tokens == whole.usage.input_tokens > 0
    for usage in (start.usage, whole.usage, events[-2].usage):
        assert usage.cache_creation_input_tokens == 0
        assert usage.cache_read_input_tokens == 0
    text = "".join(e.delta.text for e in events[2:-3])
    assert [{"type": "text", "text": text}] == _blocks(whole)
    delta = events[-2]
    assert delta.delta.stop_reason == whole.stop_reason == "max_tokens"
    assert delta.usage.output_tokens == whole.usage.output_tokens == 16
    with claude.messages.stream(**kw, extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(whole)


def test_a_stop_sequence_is_held_back_and_named(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    kw: Any = {
        "model": model_id,
        "max_tokens": 48,
        "stop_sequences": [" ", "."],
        "messages": [{"role": "user", "content": "Write two sentences about cats."}],
        "extra_body": {**GREEDY, "logit_bias": NO_END_TOKENS},
    }
    whole = claude.messages.create(**kw)
    assert whole.stop_reason == "stop_sequence"
    assert whole.stop_sequence in (" ", ".")
    with claude.messages.stream(**kw) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "stop_sequence"
    assert final.stop_sequence == whole.stop_sequence
    assert "".join(texts) == whole.content[0].text
    assert whole.stop_sequence not in "".join(texts)


def test_a_forced_tool_call_is_one_tool_use_block_streamed_and_not(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    kw: Any = {
        "model": model_id,
        "max_tokens": 64,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "extra_body": GREEDY,
    }
    whole = claude.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    (call,) = [b for b in whole.content if b.type == "tool_use"]
    assert call.name == "get_weather"
    assert set(call.input) == {"city"}
    events = list(claude.messages.create(**kw, stream=True))
    starts = [e for e in events if e.type == "content_block_start"]
    assert [s.content_block.type for s in starts][-1] == "tool_use"
    pieces = [
        e.delta.partial_json
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert json.loads("".join(pieces)) == call.input
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(whole)
    assert final.stop_reason == "tool_use"


def test_a_tool_result_in_the_history_round_trips(
    claude: anthropic.Anthropic, model_id: str, http: httpx.Client
) -> None:
    history: Any = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"}
            ],
        },
    ]
    answer = claude.messages.create(
        model=model_id,
        max_tokens=8,
        tools=[WEATHER],
        messages=history,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"]
    none: Any = {"type": "none"}
    counted = claude.messages.count_tokens(
        model=model_id, tools=[WEATHER], tool_choice=none, messages=history
    )
    shorter = claude.messages.count_tokens(
        model=model_id, tools=[WEATHER], tool_choice=none, messages=history[:1]
    )
    assert counted.input_tokens == answer.usage.input_tokens
    assert counted.input_tokens > shorter.input_tokens > 0


def test_errors_are_in_anthropic_shape_before_the_stream(
    claude: anthropic.Anthropic, model_id: str, http: httpx.Client
) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=model_id, max_tokens=0, messages=HELLO)
    assert _body(bad.value)["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in _body(bad.value)["error"]["message"]
    missing = http.post("/v1/messages", json={"model": model_id, "messages": HELLO})
    assert missing.status_code == 400
    assert missing.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Missing required parameter: 'max_tokens'",
        },
    }
    image = {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
    refused = http.post(
        "/v1/messages",
        json={
            "model": model_id,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [image]}],
        },
    )
    assert refused.status_code == 400
    assert "'image'" in refused.json()["error"]["message"]
    result: Any = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "a chart:"}, image],
    }
    call: Any = {"type": "tool_use", "id": "toolu_1", "name": "chart", "input": {}}
    with pytest.raises(anthropic.BadRequestError) as nested:
        claude.messages.create(
            model=model_id,
            max_tokens=4,
            messages=[
                {"role": "user", "content": "Draw it."},
                {"role": "assistant", "content": [call]},
                {"role": "user", "content": [result]},
            ],
        )
    assert _body(nested.value)["error"]["message"] == (
        "messages[2].content[0].content[1]: content blocks of type 'image' are"
        " not supported (this server serves text models)"
    )
    with pytest.raises(anthropic.BadRequestError) as thought:
        claude.messages.create(
            model=model_id,
            max_tokens=4,
            messages=HELLO,
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    assert "thinking" in _body(thought.value)["error"]["message"]
    plain = claude.messages.create(
        model=model_id, max_tokens=4, messages=HELLO, thinking={"type": "disabled"}
    )
    assert plain.stop_reason in ("max_tokens", "end_turn")
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(model="no-such-model", max_tokens=4, messages=HELLO)
    assert _body(unknown.value)["error"]["type"] == "not_found_error"


def test_what_anthropic_refuses_is_a_400_naming_the_field_once(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    """A block's missing field was named with its type twice
    (``messages[0].content[0].text.text``); an empty message, a user's thinking
    block and thinking with a forced tool_choice were served."""
    thought: Any = {"type": "thinking", "thinking": "hm", "signature": "s"}
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    result: Any = {"type": "tool_result", "tool_use_id": "t", "content": [{}]}
    refused: list[tuple[dict[str, Any], str]] = [
        (
            {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "Missing required parameter: 'messages[0].content[0].text'",
        ),
        (
            {"messages": [{"role": "user", "content": [result]}]},
            "Missing required parameter: 'messages[0].content[0].content[0].type'",
        ),
        (
            {"messages": [{"role": "user", "content": []}]},
            "messages[0]: all messages must have non-empty content except for"
            " the optional final assistant message",
        ),
        (
            {"messages": [{"role": "user", "content": [thought]}]},
            "messages[0].content[0]: 'thinking' blocks may only be in assistant"
            " messages",
        ),
    ]
    for choice in ({"type": "any"}, {"type": "tool", "name": WEATHER["name"]}):
        forced = {"tools": [WEATHER], "tool_choice": choice, "thinking": thinking}
        message = "Thinking may not be enabled when tool_choice forces tool use"
        refused.append(({**forced, "max_tokens": 2048, "messages": HELLO}, message))
    for body, message in refused:
        kw: Any = {"model": model_id, "max_tokens": 4, **body}
        with pytest.raises(anthropic.BadRequestError) as bad:
            claude.messages.create(**kw)
        error = _body(bad.value)["error"]
        assert error["type"] == "invalid_request_error"
        assert message in error["message"], error
    prefill: Any = [*HELLO, {"role": "assistant", "content": []}]  # may be empty
    assert claude.messages.count_tokens(model=model_id, messages=prefill).input_tokens


def test_an_empty_text_block_is_refused_wherever_it_is(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    """Anthropic refuses ``{"type": "text", "text": ""}`` with a 400 ("messages:
    text content blocks must be non-empty"), in any message, a tool result's
    content or the system prompt; this server served it. Empty string content
    stays allowed where Anthropic allows it (the final assistant message)."""
    empty: Any = {"type": "text", "text": ""}
    call: Any = {"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}
    result: Any = {"type": "tool_result", "tool_use_id": "t", "content": [empty]}
    called: Any = [*HELLO, {"role": "assistant", "content": [call]}]
    cases: list[tuple[dict[str, Any], str]] = [
        (
            {"messages": [{"role": "user", "content": [empty]}]},
            "messages[0].content[0]",
        ),
        (
            {"messages": [*HELLO, {"role": "assistant", "content": [empty, call]}]},
            "messages[1].content[0]",
        ),
        (
            {"messages": [*called, {"role": "user", "content": [result]}]},
            "messages[2].content[0].content[0]",
        ),
        ({"messages": HELLO, "system": [empty]}, "system[0]"),
    ]
    for body, where in cases:
        with pytest.raises(anthropic.BadRequestError) as bad:
            claude.messages.create(model=model_id, max_tokens=4, **body)
        error = _body(bad.value)["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"] == f"{where}: text content blocks must be non-empty"
    prefill: Any = [*HELLO, {"role": "assistant", "content": ""}]
    assert claude.messages.count_tokens(model=model_id, messages=prefill).input_tokens


def test_closing_a_message_stream_aborts_the_engine(
    base_url: str, http: httpx.Client, model_id: str
) -> None:
    body = {
        "model": model_id,
        "max_tokens": 1024,
        "stream": True,
        "messages": [{"role": "user", "content": "Write a long story."}],
        "logit_bias": NO_END_TOKENS,
    }
    before = engine_stats(http)
    started_s = time.monotonic()
    with RawExchange(base_url, "/v1/messages", body) as exchange:
        assert exchange.read_response().status_code == 200
        seen = []
        for event in exchange.iter_events():
            seen.append(json.loads(event)["type"])
            if seen[-1] == "content_block_delta":
                break
        request_id, _ = new_running_id(http, before, started_s)
        closed_at_s = exchange.close()
    assert seen[0] == "message_start"
    assert_aborted(http, request_id, closed_at_s, before)


@pytest.fixture(scope="module")
def scripted(start_server: StartServer) -> ServerProcess:
    """A scripted engine that fails at its third step, with a 1.5 s prefill,
    heartbeats every 0.2 s, and an API key."""
    return start_server(
        "scripted-messages",
        *("--engine", "scripted", "--heartbeat-s", "0.2", "--api-key", KEY),
        *("--fault", "error-after:3", "--fault", "prefill-delay:1.5"),
    )


def test_a_fault_mid_stream_is_one_error_event_after_pings(
    scripted: ServerProcess,
) -> None:
    body = {
        "model": "default",
        "max_tokens": 64,
        "stream": True,
        "messages": HELLO,
    }
    auth = {"x-api-key": KEY}
    with (
        httpx.Client(base_url=scripted.base_url, timeout=30, headers=auth) as client,
        client.stream("POST", "/v1/messages", json=body) as response,
    ):
        assert response.status_code == 200
        raw = response.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    names = [f.split("\n")[0].removeprefix("event: ") for f in frames]
    assert names[0] == "message_start"
    assert "ping" in names[: names.index("content_block_start")]
    assert names[-1] == "error"
    assert names.count("error") == 1
    assert "message_stop" not in names
    assert "message_delta" not in names
    error = json.loads(frames[-1].split("\n")[1].removeprefix("data: "))
    assert error["type"] == "error"
    assert error["error"]["type"] == "api_error"
    assert error["error"]["message"]
    claude = anthropic.Anthropic(base_url=scripted.base_url, api_key=KEY, max_retries=0)
    with pytest.raises(anthropic.APIStatusError):
        for _ in claude.messages.create(
            model="default", max_tokens=64, messages=HELLO, stream=True
        ):
            pass
    claude.close()


@pytest.fixture(scope="module")
def too_slow(start_server: StartServer) -> ServerProcess:
    """A scripted engine whose prefill outlasts the request's time limit."""
    return start_server(
        "scripted-too-slow",
        *("--engine", "scripted", "--fault", "prefill-delay:60"),
        *("--request-timeout-s", "0.3", "--log-level", "warning"),
    )


def test_a_request_past_its_time_limit_is_a_504_timeout_error(
    too_slow: ServerProcess,
) -> None:
    """Anthropic's "Errors" page lists 504 as ``timeout_error``; it was
    ``api_error``, the type of an internal error."""
    claude = anthropic.Anthropic(base_url=too_slow.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.InternalServerError) as late:
        claude.messages.create(model="default", max_tokens=8, messages=HELLO)
    claude.close()
    assert late.value.status_code == 504
    assert _body(late.value)["error"]["type"] == "timeout_error"


def test_the_api_key_may_come_as_x_api_key_and_a_wrong_one_is_a_401(
    scripted: ServerProcess,
) -> None:
    wrong = anthropic.Anthropic(
        base_url=scripted.base_url, api_key="sk-wrong", max_retries=0
    )
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model="default", max_tokens=4, messages=HELLO)
    wrong.close()
    assert refused.value.status_code == 401
    assert _body(refused.value)["error"]["type"] == "authentication_error"
    right = anthropic.Anthropic(base_url=scripted.base_url, api_key=KEY, max_retries=0)
    counted = right.messages.count_tokens(model="default", messages=HELLO)
    right.close()
    assert counted.input_tokens > 0


def test_structured_output_is_json_of_the_schema_streamed_and_not(
    claude: anthropic.Anthropic, model_id: str
) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"],
        "additionalProperties": False,
    }
    kw: Any = {
        "model": model_id,
        "max_tokens": 32,
        "messages": [{"role": "user", "content": "Name a cat, as JSON."}],
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
        "extra_body": GREEDY,
    }
    whole = claude.messages.create(**kw)
    assert whole.stop_reason == "end_turn"
    value = json.loads(whole.content[0].text)
    assert set(value) == {"name"}
    assert isinstance(value["name"], str)
    with claude.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert _blocks(final) == _blocks(whole)
