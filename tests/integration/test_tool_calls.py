"""Tool calls through the official openai SDK, on real server processes.

A scripted server writes two calls, so the exact shapes can be checked,
streamed (including the SDK's ``chat.completions.stream`` helper, which
accumulates tool calls) and not. The real-model tests need the grammar that
constrains a call (the tiny model rarely writes one unaided).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel

from .servers import ServerProcess, StartServer

pytestmark = pytest.mark.integration

ARGUMENTS = '{"city": "Paris </tool_call>", "days": [1, 2]}'
SCRIPT = (
    'Checking.\n<tool_call>{"name": "get_weather", "arguments": '
    f'{ARGUMENTS}}}</tool_call>\n<tool_call>{{"name": "get_time", "arguments": {{}}}}'
    "</tool_call><end_of_turn>"
)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "Now."}},
]
ASK: list[Any] = [{"role": "user", "content": "Weather in Paris, and the time?"}]


@pytest.fixture(scope="module")
def scripted(start_server: StartServer, tmp_path_factory: pytest.TempPathFactory):
    script = Path(tmp_path_factory.mktemp("tools")) / "script.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    return start_server(
        "scripted-tools",
        "--engine",
        "scripted",
        "--scripted-rate",
        "2000",
        "--scripted-text",
        str(script),
    )


@pytest.fixture
def scripted_sdk(scripted: ServerProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=f"{scripted.base_url}/v1", api_key="x", max_retries=0
    )
    yield client
    client.close()


def _calls(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def test_sdk_non_streamed_calls(scripted_sdk: openai.OpenAI) -> None:
    response = scripted_sdk.chat.completions.create(
        model="scripted", messages=ASK, tools=TOOLS
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking.\n"
    assert _calls(choice.message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    assert all(c.id.startswith("call_") for c in choice.message.tool_calls or ())


def test_sdk_stream_helper_accumulates_the_same_calls(
    scripted_sdk: openai.OpenAI,
) -> None:
    with scripted_sdk.chat.completions.stream(
        model="scripted", messages=ASK, tools=TOOLS
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert _calls(choice.message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [(e.name, e.arguments) for e in done] == _calls(choice.message)
    assert json.loads(done[0].arguments) == json.loads(ARGUMENTS)


def test_sdk_raw_stream_sends_each_id_and_name_once(
    scripted_sdk: openai.OpenAI,
) -> None:
    stream = scripted_sdk.chat.completions.create(
        model="scripted", messages=ASK, tools=TOOLS, stream=True
    )
    ids: list[str] = []
    names: list[str] = []
    for chunk in stream:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                if call.id is not None:
                    ids.append(call.id)
                    assert call.function is not None
                    assert call.function.arguments == ""
                if call.function is not None and call.function.name is not None:
                    names.append(call.function.name)
    assert len(set(ids)) == len(ids) == 2
    assert names == ["get_weather", "get_time"]


# -- the real model, under the grammar ---------------------------------------


def _grammar_wired() -> bool:
    try:
        from sluicegate.engines.base import SamplingParams

        return "grammar" in SamplingParams.__dataclass_fields__
    except ImportError:  # pragma: no cover - the package is always there
        return False


needs_grammar = pytest.mark.skipif(
    not _grammar_wired(), reason="constrained decoding is not wired in yet"
)


def required_call(model_id: str, **changes: Any) -> dict[str, Any]:
    """The request the real-model tests vary: ``get_weather``, which the model
    must call, at temperature 0."""
    kwargs: dict[str, Any] = {
        "model": model_id,
        "messages": ASK,
        "tools": TOOLS[:1],
        "tool_choice": "required",
        "max_tokens": 128,
        "temperature": 0,
    }
    return {**kwargs, **changes}


def stream_snapshot(sdk: openai.OpenAI, kwargs: dict[str, Any]) -> Any:
    """The stream helper's completion, however the answer finished."""
    with sdk.chat.completions.stream(**kwargs) as events:
        list(events)  # get_final_completion() raises for "length"
        return events.current_completion_snapshot


@needs_grammar
@pytest.mark.llamacpp
@pytest.mark.parametrize("stream", [False, True])
def test_real_model_required_call_is_valid_json(
    sdk: openai.OpenAI, model_id: str, stream: bool
) -> None:
    kwargs = required_call(model_id)
    if stream:
        final = stream_snapshot(sdk, kwargs)
    else:
        final = sdk.chat.completions.create(**kwargs)
    choice = final.choices[0]
    assert choice.finish_reason in ("tool_calls", "length")
    if choice.finish_reason == "tool_calls":
        ((name, arguments),) = _calls(choice.message)
        assert name == "get_weather"
        assert isinstance(json.loads(arguments), dict)


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_named_parameterless_call_gets_braces(
    sdk: openai.OpenAI, model_id: str
) -> None:
    response = sdk.chat.completions.create(
        model=model_id,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=32,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    ((name, arguments),) = _calls(choice.message)
    assert (name, json.loads(arguments)) == ("get_time", {})
    assert choice.message.content is None


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_named_choice_calls_that_function_in_responses_and_messages(
    sdk: openai.OpenAI, base_url: str, model_id: str
) -> None:
    # Asked about the weather with both tools offered, it must call get_time.
    ask = "What is the weather in Paris?"
    tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    named: Any = {"type": "function", "name": "get_time"}
    kw: Any = {"model": model_id, "input": ask, "tools": tools, "temperature": 0}
    with sdk.responses.stream(**kw, tool_choice=named, max_output_tokens=32) as stream:
        final = stream.get_final_response()
    assert [(o.type, getattr(o, "name", None)) for o in final.output] == [
        ("function_call", "get_time")
    ]
    functions: Any = [
        {"name": "get_weather", "input_schema": TOOLS[0]["function"]["parameters"]},
        {"name": "get_time", "input_schema": {"type": "object"}},
    ]
    with anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0) as claude:
        message = claude.messages.create(
            model=model_id,
            max_tokens=32,
            messages=[{"role": "user", "content": ask}],
            tools=functions,
            tool_choice={"type": "tool", "name": "get_time"},
            extra_body={"temperature": 0},
        )
    assert [(b.type, getattr(b, "name", None)) for b in message.content] == [
        ("tool_use", "get_time")
    ]
    assert message.stop_reason == "tool_use"


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_streamed_call_equals_the_non_streamed_one(
    sdk: openai.OpenAI, model_id: str
) -> None:
    kwargs = required_call(model_id, seed=7)
    whole = sdk.chat.completions.create(**kwargs)
    streamed = stream_snapshot(sdk, kwargs)
    assert _calls(streamed.choices[0].message) == _calls(whole.choices[0].message)
    assert streamed.choices[0].finish_reason == whole.choices[0].finish_reason


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_max_tokens_cutting_a_call_is_length(
    sdk: openai.OpenAI, model_id: str
) -> None:
    response = sdk.chat.completions.create(**required_call(model_id, max_tokens=8))
    assert response.choices[0].finish_reason == "length"


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_answers_after_a_tool_result(
    sdk: openai.OpenAI, model_id: str
) -> None:
    history: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris"}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    response = sdk.chat.completions.create(
        model=model_id,
        messages=history,
        tools=TOOLS[:1],
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.tool_calls is None
    assert choice.message.content


# -- the SDK's accumulating and parsing helpers, on the real model ------------


class GetWeather(BaseModel):
    """The weather in a city."""

    city: str
    unit: Literal["c", "f"]


NAMED_WEATHER: Any = {"type": "function", "function": {"name": "get_weather"}}


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_stream_helper_final_calls_equal_the_non_streamed_create(
    sdk: openai.OpenAI, model_id: str
) -> None:
    kwargs = required_call(model_id, tool_choice=NAMED_WEATHER, max_tokens=64)
    whole = sdk.chat.completions.create(**kwargs)
    with sdk.chat.completions.stream(**kwargs) as events:
        done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
        final = events.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].finish_reason == "tool_calls"
    calls = _calls(whole.choices[0].message)
    assert len(calls) == 1
    assert _calls(final.choices[0].message) == calls
    assert [(e.name, e.arguments) for e in done] == calls
    assert isinstance(json.loads(calls[0][1]), dict)


@needs_grammar
@pytest.mark.llamacpp
def test_real_model_parse_fills_a_strict_pydantic_tools_arguments(
    sdk: openai.OpenAI, model_id: str
) -> None:
    tool = openai.pydantic_function_tool(GetWeather)
    assert tool["function"].get("strict") is True
    kwargs: Any = {
        "model": model_id,
        "messages": ASK,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "GetWeather"}},
        "max_tokens": 64,
        "temperature": 0,
    }
    whole = sdk.chat.completions.parse(**kwargs)
    with sdk.chat.completions.stream(**kwargs) as events:
        streamed = events.get_final_completion()
    parsed = []
    for completion in (whole, streamed):
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert len(calls) == 1
        call = calls[0]
        assert call.function.name == "GetWeather"
        arguments = call.function.parsed_arguments
        assert isinstance(arguments, GetWeather)
        assert arguments == GetWeather.model_validate_json(call.function.arguments)
        parsed.append((call.function.arguments, arguments))
    assert parsed[0] == parsed[1]
