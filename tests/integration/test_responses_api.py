"""The Responses API on the real model, through the official openai SDK.

The same core as the chat endpoints writes it: sequence numbers count by one,
there is exactly one terminal event, streamed and whole answers agree for text,
forced tool calls and JSON schemas, errors are OpenAI's, a client that leaves
aborts the engine, and a scripted fault ends in ``response.failed``.
"""

from __future__ import annotations

import json
import time
from typing import Any, cast

import httpx
import openai
import pytest

from .servers import ServerProcess, StartServer
from .test_disconnect import assert_aborted, new_running_id
from .wire import NO_END_TOKENS, RawExchange, engine_stats

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def _body(error: openai.APIStatusError) -> dict[str, Any]:
    """The error's JSON body."""
    return cast(dict[str, Any], error.body)


TERMINAL = {"response.completed", "response.incomplete", "response.failed"}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_stream_numbers_its_events_and_equals_the_whole_response(
    sdk: openai.OpenAI, model_id: str
) -> None:
    kw: Any = {
        "model": model_id,
        "input": "Say hello in French.",
        "max_output_tokens": 16,
        "temperature": 0,
    }
    whole = sdk.responses.create(**kw)
    assert whole.status == "incomplete"
    assert whole.incomplete_details.reason == "max_output_tokens"
    events = list(sdk.responses.create(**kw, stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [k for k in kinds if k in TERMINAL] == ["response.incomplete"]
    assert kinds[-1] == "response.incomplete"
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens == 16
    assert final.usage.total_tokens == (
        final.usage.input_tokens + final.usage.output_tokens
    )


def test_a_forced_call_and_a_json_schema_agree_through_the_stream_helper(
    sdk: openai.OpenAI, model_id: str
) -> None:
    call: Any = {
        "model": model_id,
        "input": "What is the weather in Paris?",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "temperature": 0,
        "max_output_tokens": 64,
    }
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}},
        "required": ["name"],
        "additionalProperties": False,
    }
    structured: Any = {
        "model": model_id,
        "input": "Name a cat, as JSON.",
        "text": {"format": {"type": "json_schema", "name": "cat", "schema": schema}},
        "temperature": 0,
        "max_output_tokens": 32,
    }
    for kw in (call, structured):
        whole = sdk.responses.create(**kw)
        assert whole.status == "completed"
        with sdk.responses.stream(**kw) as stream:
            final = stream.get_final_response()
        assert final.status == "completed"
        assert [o.type for o in final.output] == [o.type for o in whole.output]
        assert final.output_text == whole.output_text
    calls = sdk.responses.create(**call).output
    (fc,) = [o for o in calls if o.type == "function_call"]
    assert fc.name == "get_weather"
    assert set(json.loads(fc.arguments)) == {"city"}
    value = json.loads(whole.output_text)
    assert set(value) == {"name"}


def test_function_call_items_in_the_input_round_trip(
    sdk: openai.OpenAI, model_id: str
) -> None:
    answer = sdk.responses.create(
        model=model_id,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "Sunny"},
        ],
        instructions="Answer briefly.",
        tools=[WEATHER],
        tool_choice="none",
        max_output_tokens=8,
        temperature=0,
    )
    assert [o.type for o in answer.output] == ["message"]
    assert answer.usage is not None
    assert answer.usage.input_tokens > 20


def test_the_response_object_repeats_the_requests_tool_settings(
    sdk: openai.OpenAI, model_id: str
) -> None:
    kw: Any = {
        "model": model_id,
        "input": "Say hi.",
        "tools": [WEATHER],
        "tool_choice": "none",
        "parallel_tool_calls": False,
        "metadata": {"run": "echo"},
        "max_output_tokens": 4,
        "temperature": 0,
    }
    whole = sdk.responses.create(**kw)
    events = list(sdk.responses.create(**kw, stream=True))
    snapshots = [whole, events[0].response, events[-1].response]
    for response in snapshots:
        assert response.tool_choice == "none"
        assert response.parallel_tool_calls is False
        assert [t.model_dump(exclude_none=True) for t in response.tools] == [WEATHER]
        assert response.metadata == {"run": "echo"}
        assert response.max_output_tokens == 4
    named = sdk.responses.create(
        **{**kw, "tool_choice": {"type": "function", "name": "get_weather"}}
    )
    assert named.tool_choice.model_dump() == {
        "type": "function",
        "name": "get_weather",
    }
    plain = sdk.responses.create(model=model_id, input="Hi", max_output_tokens=2)
    assert (plain.tool_choice, plain.tools, plain.parallel_tool_calls) == (
        "auto",
        [],
        True,
    )


def test_bad_input_is_a_400_naming_the_parameter(
    sdk: openai.OpenAI, model_id: str
) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input": "x", "temperature": 5}, "temperature"),
        ({"input": "x", "background": True, "store": False}, "store"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ]
    for body, param in cases:
        with pytest.raises(openai.BadRequestError) as bad:
            sdk.responses.create(model=model_id, **body)
        assert _body(bad.value)["param"] == param, body


def test_a_template_refusal_names_the_input_item_not_the_chat_message(
    sdk: openai.OpenAI, model_id: str
) -> None:
    """The model's template refuses a system message after the first: it is
    ``input[1]``, which was chat's ``messages[2]`` behind the instructions'
    system message (the error named that, with ``param`` ``input``)."""
    turns: Any = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Be brief."},
    ]
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(
            model=model_id, instructions="Hi.", input=turns, max_output_tokens=1
        )
    error = _body(bad.value)  # the SDK's body is the error object
    assert error["param"] == "input[1]"
    assert "cannot render input[1] (role 'system')" in error["message"]
    assert "messages" not in error["message"]


def test_closing_a_response_stream_aborts_the_engine(
    base_url: str, http: httpx.Client, model_id: str
) -> None:
    body = {
        "model": model_id,
        "input": "Write a long story.",
        "max_output_tokens": 1024,
        "stream": True,
        "logit_bias": NO_END_TOKENS,
    }
    before = engine_stats(http)
    started_s = time.monotonic()
    with RawExchange(base_url, "/v1/responses", body) as exchange:
        assert exchange.read_response().status_code == 200
        for event in exchange.iter_events():
            if json.loads(event)["type"] == "response.output_text.delta":
                break
        request_id, _ = new_running_id(http, before, started_s)
        closed_at_s = exchange.close()
    assert_aborted(http, request_id, closed_at_s, before)


@pytest.fixture(scope="module")
def scripted(start_server: StartServer) -> ServerProcess:
    return start_server(
        "scripted-responses",
        *("--engine", "scripted", "--heartbeat-s", "0.2"),
        *("--fault", "error-after:3", "--fault", "prefill-delay:1.5"),
    )


def test_a_fault_mid_stream_ends_in_response_failed_after_heartbeats(
    scripted: ServerProcess,
) -> None:
    body = {"model": "default", "input": "Hi", "stream": True}
    with (
        httpx.Client(base_url=scripted.base_url, timeout=30) as client,
        client.stream("POST", "/v1/responses", json=body) as response,
    ):
        assert response.status_code == 200
        raw = response.read().decode()
    frames = [f for f in raw.split("\n\n") if f]
    in_progress = next(i for i, f in enumerate(frames) if "response.in_progress" in f)
    first_item = next(i for i, f in enumerate(frames) if "output_item.added" in f)
    assert any(f.startswith(":") for f in frames[in_progress:first_item])
    events = [json.loads(f.split("\ndata: ")[1]) for f in frames if "\ndata: " in f]
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert not TERMINAL.intersection(e["type"] for e in events[:-1])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
