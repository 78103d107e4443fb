"""Tool calls on the wire from the real model, under the grammar: the raw chunks,
read with the test's own SSE reader, against the non-streamed answer of the same
request (temperature 0, one request at a time, so the two are the same answer).

Each call's fragments are checked as OpenAI streams them: the first fragment of an
index carries ``index``, ``id``, ``type`` and ``function.name`` (with ``arguments:
""`` unless deltas were merged), later ones only ``index`` and
``function.arguments``; indexes count from 0 in order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import openai
import pytest

from sluicegate.client import Client

from .servers import N_CTX, PARALLEL, ServerProcess, StartServer
from .wire import RawExchange, record_stream, stream_chunks

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time; takes no arguments",
        "parameters": {"type": "object", "properties": {}},
    },
}
PARIS: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
MARKUP = ("<tool_call>", "</tool_call>", "<tool_response", "</tool_response>")

Call = tuple[str, str]
"""``(function name, arguments text)``."""


def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def request(model_id: str, messages: list[Any], **fields: Any) -> dict[str, Any]:
    return {"model": model_id, "messages": messages, "temperature": 0, **fields}


def streamed(http: httpx.Client, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chunks of the streamed answer (``[DONE]`` checked and left out)."""
    return stream_chunks(record_stream(http, CHAT, {**body, "stream": True}))


def whole(http: httpx.Client, body: Mapping[str, Any]) -> dict[str, Any]:
    """Choice 0 of the non-streamed answer."""
    response = http.post(CHAT, json={**body, "stream": False})
    assert response.status_code == 200, response.text
    choice: dict[str, Any] = response.json()["choices"][0]
    return choice


def deltas(chunks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [c["delta"] for chunk in chunks for c in chunk["choices"] if "delta" in c]


def finishes(chunks: Sequence[Mapping[str, Any]]) -> list[str]:
    return [
        c["finish_reason"]
        for chunk in chunks
        for c in chunk["choices"]
        if c.get("finish_reason") is not None
    ]


def content(chunks: Sequence[Mapping[str, Any]]) -> str:
    return "".join(d.get("content") or "" for d in deltas(chunks))


def checked_calls(
    chunks: Sequence[Mapping[str, Any]], *, merged: bool = False
) -> list[Call]:
    """The streamed calls, joined by index, after checking every fragment.

    Args:
        merged: deltas may have been merged (a slow reader), so a call's first
            fragment may carry arguments too.
    """
    calls: list[dict[str, Any]] = []
    for delta in deltas(chunks):
        items = delta.get("tool_calls") or []
        indexes = [item["index"] for item in items]
        assert len(indexes) == len(set(indexes)), f"two fragments of one call: {delta}"
        for item in items:
            if item["index"] == len(calls):  # a new call: its head, once
                assert set(item) == {"index", "id", "type", "function"}, item
                assert item["type"] == "function", item
                assert item["id"].startswith("call_"), item
                assert set(item["function"]) == {"name", "arguments"}, item
                assert merged or item["function"]["arguments"] == "", item
                calls.append({**item["function"], "id": item["id"]})
            else:
                assert item["index"] < len(calls), f"index out of order: {item}"
                assert set(item) == {"index", "function"}, item
                assert set(item["function"]) == {"arguments"}, item
                calls[item["index"]]["arguments"] += item["function"]["arguments"]
    ids = [c["id"] for c in calls]
    assert len(set(ids)) == len(ids), ids
    return [(c["name"], c["arguments"]) for c in calls]


def whole_calls(choice: Mapping[str, Any]) -> list[Call]:
    calls = choice["message"].get("tool_calls") or []
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    return [(c["function"]["name"], c["function"]["arguments"]) for c in calls]


def assert_weather_arguments(arguments: str) -> None:
    """``arguments`` is a JSON object that keeps ``get_weather``'s schema."""
    value = json.loads(arguments)
    assert isinstance(value, dict), arguments
    assert "city" in value, arguments
    assert set(value) <= {"city", "unit"}, arguments
    assert isinstance(value["city"], str), arguments
    assert value.get("unit", "c") in ("c", "f"), arguments


def test_a_named_call_streams_its_head_once_and_equals_the_non_streamed_call(
    http: httpx.Client, model_id: str
) -> None:
    body = request(
        model_id,
        PARIS,
        tools=[WEATHER],
        tool_choice=named("get_weather"),
        max_tokens=64,
    )
    chunks = streamed(http, body)
    ((name, arguments),) = checked_calls(chunks)
    assert name == "get_weather"
    assert_weather_arguments(arguments)
    assert finishes(chunks) == ["tool_calls"]
    assert all(d.get("content") is None for d in deltas(chunks)), deltas(chunks)
    choice = whole(http, body)
    assert whole_calls(choice) == [(name, arguments)]  # byte for byte
    assert choice["message"]["content"] is None
    assert choice["finish_reason"] == "tool_calls"


def test_a_call_without_parameters_has_arguments_of_exactly_braces(
    http: httpx.Client, model_id: str
) -> None:
    body = request(
        model_id,
        [{"role": "user", "content": "What time is it?"}],
        tools=[TIME, WEATHER],
        tool_choice=named("get_time"),
        max_tokens=32,
    )
    chunks = streamed(http, body)
    assert checked_calls(chunks) == [("get_time", "{}")]
    assert finishes(chunks) == ["tool_calls"]
    choice = whole(http, body)
    assert whole_calls(choice) == [("get_time", "{}")]
    assert choice["finish_reason"] == "tool_calls"


def test_required_calls_have_their_own_indices_and_equal_the_non_streamed_ones(
    http: httpx.Client, model_id: str
) -> None:
    body = request(
        model_id,
        [{"role": "user", "content": "Weather in Paris and in Tokyo, please."}],
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=128,
    )
    chunks = streamed(http, body)
    calls = checked_calls(chunks)  # indexes from 0 in order, distinct ids
    assert calls, "tool_choice required, but no call"
    (finish,) = finishes(chunks)
    choice = whole(http, body)
    assert whole_calls(choice) == calls
    assert choice["finish_reason"] == finish
    # The default model may go on calling until max_tokens: then the answer
    # finishes with length, and only its last call may be cut short.
    *done, last = calls
    for name, arguments in done:
        assert name == "get_weather"
        assert_weather_arguments(arguments)
    assert finish in ("tool_calls", "length")
    if finish == "tool_calls":
        assert_weather_arguments(last[1])


def final_completion(sdk: openai.OpenAI, body: Mapping[str, Any]) -> Any:
    """The SDK stream helper's final completion (it refuses a cut answer,
    while streaming or at the end)."""
    with sdk.chat.completions.stream(**body) as events:
        list(events)
        return events.get_final_completion()


def test_max_tokens_cutting_a_call_is_length_and_no_client_takes_it_as_a_call(
    http: httpx.Client, sdk: openai.OpenAI, base_url: str, model_id: str
) -> None:
    body = request(
        model_id, PARIS, tools=[WEATHER], tool_choice=named("get_weather"), max_tokens=6
    )
    assert finishes(streamed(http, body)) == ["length"]
    assert whole(http, body)["finish_reason"] == "length"
    with Client(base_url) as client:
        params = {k: v for k, v in body.items() if k not in ("model", "messages")}
        with client.stream_chat(PARIS, model=model_id, **params) as stream:
            for _ in stream:
                pass
            result = stream.result()
    assert result.finish_reason == "length"
    assert result.choices[0].tool_calls == ()
    with pytest.raises(openai.LengthFinishReasonError):
        final_completion(sdk, body)


HISTORY: list[Any] = [
    *PARIS,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": '{"temp_c": 18, "sky": "clear"}',
    },
]


def test_a_call_and_its_result_in_the_history_give_text_with_tool_choice_none(
    http: httpx.Client, model_id: str
) -> None:
    body = request(
        model_id, HISTORY, tools=[WEATHER], tool_choice="none", max_tokens=32
    )
    chunks = streamed(http, body)  # asserts 200
    assert all("tool_calls" not in d for d in deltas(chunks)), deltas(chunks)
    assert len(finishes(chunks)) == 1
    assert finishes(chunks)[0] in ("stop", "length")
    assert content(chunks).strip()


def test_tool_choice_none_keeps_tool_markup_out_of_the_content(
    http: httpx.Client, model_id: str
) -> None:
    body = request(
        model_id, HISTORY, tools=[WEATHER], tool_choice="none", max_tokens=32
    )
    text = content(streamed(http, body))
    assert not [m for m in MARKUP if m in text], text


# -- a slow reader, on a server that paces its events ---------------------------


@pytest.fixture(scope="module")
def paced(start_server: StartServer) -> ServerProcess:
    """The default model as the session's server has it, but at most one event
    per stream every 200 ms: what the engine makes in between is merged."""
    return start_server(
        "llamacpp-paced",
        "--log-level",
        "warning",
        "--engine",
        "llamacpp",
        "--n-ctx",
        str(N_CTX),
        "--parallel",
        str(PARALLEL),
        "--stream-interval-ms",
        "200",
    )


def slow_read(base_url: str, body: Mapping[str, Any]) -> Iterator[str]:
    """Every event of the streamed answer, with a pause after each."""
    with RawExchange(base_url, CHAT, {**body, "stream": True}) as exchange:
        assert exchange.read_response().status_code == 200
        for event in exchange.iter_events():
            yield event
            time.sleep(0.05)


def test_a_slow_reader_gets_the_same_calls_with_no_fragment_mixing_two_calls(
    http: httpx.Client, paced: ServerProcess, model_id: str
) -> None:
    body = request(
        model_id,
        PARIS,
        tools=[WEATHER],
        tool_choice=named("get_weather"),
        max_tokens=64,
    )
    fast = checked_calls(streamed(http, body))
    events = list(slow_read(paced.base_url, body))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert checked_calls(chunks, merged=True) == fast
    assert finishes(chunks) == ["tool_calls"]
