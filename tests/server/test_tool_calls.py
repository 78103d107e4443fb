"""Tool calls end to end through the app, on a scripted engine that writes them."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette

from sluicegate.engines.scripted.engine import ScriptedEngine, ScriptedTokenizer
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, HELLO, Exchange, exchange
from .test_slow_consumers import StalledExchange

pytestmark = pytest.mark.anyio

ARGUMENTS = '{"city": "Paris </tool_call>", "days": [1, 2]}'
SCRIPT = (
    'Let me check.\n<tool_call>{"name": "get_weather", "arguments": '
    f'{ARGUMENTS}}}</tool_call>\n<tool_call>{{"name": "get_time", "arguments": {{}}}}'
    "</tool_call><end_of_turn>"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def _app(script: str = SCRIPT, rate: float = 5000) -> Starlette:
    return create_app(ScriptedEngine(script, tokens_per_s=rate), ServerConfig())


def _body(**extra: Any) -> dict[str, Any]:
    return {"messages": HELLO, "tools": TOOLS, **extra}


def _calls_of(payloads: list[dict[str, Any]], index: int = 0) -> list[dict[str, Any]]:
    """Every ``tool_calls`` item of choice ``index``, in wire order."""
    return [
        call
        for p in payloads
        for c in p["choices"]
        if c["index"] == index
        for call in c["delta"].get("tool_calls", ())
    ]


def _assembled(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls: dict[int, dict[str, Any]] = {}
    for item in items:
        if "id" in item:
            assert item["index"] not in calls, "one id per call"
            calls[item["index"]] = {
                "id": item["id"],
                "type": item["type"],
                "function": {"name": item["function"]["name"], "arguments": ""},
            }
        else:
            assert set(item) == {"index", "function"}
            assert set(item["function"]) == {"arguments"}
        calls[item["index"]]["function"]["arguments"] += item["function"]["arguments"]
    assert list(calls) == list(range(len(calls)))
    return list(calls.values())


def _finish_reasons(payloads: list[dict[str, Any]]) -> dict[int, str]:
    return {
        c["index"]: c["finish_reason"]
        for p in payloads
        for c in p["choices"]
        if c["finish_reason"] is not None
    }


async def test_streamed_calls_have_the_openai_shape_and_finish_with_tool_calls():
    ex = await exchange(_app(), CHAT, _body(stream=True))
    assert ex.completed
    items = _calls_of(ex.payloads())
    starts = [item for item in items if "id" in item]
    assert starts == [
        {
            "index": 0,
            "id": starts[0]["id"],
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        },
        {
            "index": 1,
            "id": starts[1]["id"],
            "type": "function",
            "function": {"name": "get_time", "arguments": ""},
        },
    ]
    assert all(s["id"].startswith("call_") and len(s["id"]) == 29 for s in starts)
    calls = _assembled(items)
    assert [c["function"]["arguments"] for c in calls] == [ARGUMENTS, "{}"]
    assert "".join(ex.contents()) == "Let me check.\n"
    assert _finish_reasons(ex.payloads()) == {0: "tool_calls"}


async def test_the_json_response_says_what_the_stream_says():
    app = _app()
    streamed = await exchange(app, CHAT, _body(stream=True))
    whole = await exchange(app, CHAT, _body())
    assert whole.status == 200
    (choice,) = json.loads(whole.body)["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "".join(streamed.contents())
    calls = message["tool_calls"]
    expected = _assembled(_calls_of(streamed.payloads()))
    for call, other in zip(calls, expected, strict=True):
        assert call["id"].startswith("call_")
        assert {**call, "id": ""} == {**other, "id": ""}


async def test_only_calls_give_null_content():
    script = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><end_of_turn>'
    ex = await exchange(_app(script), CHAT, _body(tool_choice="required"))
    message = json.loads(ex.body)["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": "{}",
    }


async def test_each_choice_has_its_own_calls_and_ids():
    ex = await exchange(_app(), CHAT, _body(stream=True, n=2))
    first, second = (
        _assembled(_calls_of(ex.payloads(), 0)),
        _assembled(_calls_of(ex.payloads(), 1)),
    )
    assert [c["function"] for c in first] == [c["function"] for c in second]
    assert {c["id"] for c in first}.isdisjoint(c["id"] for c in second)
    assert _finish_reasons(ex.payloads()) == {0: "tool_calls", 1: "tool_calls"}


async def test_max_tokens_cutting_a_call_finishes_with_length_in_both_modes():
    app = _app()
    middle = SCRIPT[: SCRIPT.index(ARGUMENTS) + 10]
    cut = len(ScriptedTokenizer().encode(middle, add_special=False, parse_special=True))
    body = _body(max_tokens=cut)
    streamed = await exchange(app, CHAT, {**body, "stream": True})
    assert _finish_reasons(streamed.payloads()) == {0: "length"}
    (call,) = _assembled(_calls_of(streamed.payloads()))
    assert ARGUMENTS.startswith(call["function"]["arguments"])
    assert call["function"]["arguments"] != ARGUMENTS
    whole = json.loads((await exchange(app, CHAT, body)).body)["choices"][0]
    assert whole["finish_reason"] == "length"
    assert whole["message"]["tool_calls"][0]["function"] == call["function"]


async def test_tool_choice_none_ends_the_answer_where_tool_markup_would_start():
    app = _app()
    whole = json.loads((await exchange(app, CHAT, _body(tool_choice="none"))).body)
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["content"] == "Let me check.\n"
    streamed = await exchange(app, CHAT, _body(tool_choice="none", stream=True))
    assert _calls_of(streamed.payloads()) == []
    assert "".join(streamed.contents()) == "Let me check.\n"
    assert _finish_reasons(streamed.payloads()) == {0: "stop"}


async def test_tool_choice_none_with_the_stop_string_in_the_output_keeps_the_text():
    # The tag would be sent as the matched stop string: no markup stop then.
    body = _body(tool_choice="none", include_stop_str_in_output=True)
    choice = json.loads((await exchange(_app(), CHAT, body)).body)["choices"][0]
    assert choice["message"]["content"].startswith("Let me check.\n<tool_call>")


async def test_tool_choice_none_under_a_response_format_adds_no_markup_stop():
    # The format's grammar constrains the text (the scripted engine ignores it):
    # no stop string may cut a value that happens to hold a tag.
    body = _body(tool_choice="none", response_format={"type": "json_object"})
    choice = json.loads((await exchange(_app(), CHAT, body)).body)["choices"][0]
    assert choice["message"]["content"].startswith("Let me check.\n<tool_call>")


async def test_a_forced_call_cut_inside_its_opening_tag_sends_no_content():
    script = SCRIPT[SCRIPT.index("<tool_call>") :]
    tokenizer = ScriptedTokenizer()
    cut = len(tokenizer.encode("<tool_", add_special=False, parse_special=True))
    body = _body(tool_choice="required", max_tokens=cut, stream=True)
    streamed = await exchange(_app(script), CHAT, body)
    assert streamed.contents() == []
    assert _calls_of(streamed.payloads()) == []
    assert _finish_reasons(streamed.payloads()) == {0: "length"}


async def test_parallel_calls_off_keeps_the_first_call_only():
    ex = await exchange(_app(), CHAT, _body(parallel_tool_calls=False))
    choice = json.loads(ex.body)["choices"][0]
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == [
        "get_weather"
    ]
    assert choice["finish_reason"] == "tool_calls"


async def test_a_slow_reader_gets_joined_fragments_and_the_same_calls():
    engine = ScriptedEngine(SCRIPT, tokens_per_s=2000)
    app = create_app(engine, ServerConfig())
    ex = StalledExchange(app, _body(stream=True), open_for=2)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ex.run)
            await ex.wait_for(lambda: engine.stats().finished_requests == 1)
            ex.gate.set()
    assert app.state.live.coalesced_events > 10
    items = _calls_of(ex.payloads())
    calls = _assembled(items)
    assert [c["function"]["arguments"] for c in calls] == [ARGUMENTS, "{}"]
    # Coalesced: fewer items than fragments, never two of one index in a delta.
    for payload in ex.payloads():
        for choice in payload["choices"]:
            indexes = [t["index"] for t in choice["delta"].get("tool_calls", ())]
            assert len(indexes) == len(set(indexes))
    assert _finish_reasons(ex.payloads()) == {0: "tool_calls"}


async def test_history_with_calls_and_results_renders_and_answers():
    messages = [
        {"role": "user", "content": "Weather?"},
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
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    ex = await exchange(
        _app("Sunny.<end_of_turn>"), CHAT, {**_body(), "messages": messages}
    )
    assert ex.status == 200
    choice = json.loads(ex.body)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Sunny."}
    assert choice["finish_reason"] == "stop"


async def test_an_unknown_named_tool_is_a_400_before_streaming():
    ex = Exchange(
        _app(),
        CHAT,
        _body(stream=True, tool_choice={"type": "function", "function": {"name": "x"}}),
    )
    with anyio.fail_after(5):
        await ex.run()
    assert ex.status == 400
    assert json.loads(ex.body)["error"]["param"] == "tool_choice"


async def test_logprobs_cover_the_content_tokens_alike_streamed_and_not():
    app = _app()
    body = _body(logprobs=True, top_logprobs=1)
    whole = json.loads((await exchange(app, CHAT, body)).body)["choices"][0]
    streamed = await exchange(app, CHAT, {**body, "stream": True})
    entries = [
        entry
        for p in streamed.payloads()
        for c in p["choices"]
        if c.get("logprobs")
        for entry in c["logprobs"]["content"]
    ]
    assert entries == whole["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == "Let me check.\n"
    assert whole["finish_reason"] == "tool_calls"
