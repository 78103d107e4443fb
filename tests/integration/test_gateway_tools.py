"""Tool calls through a gateway: the same calls, in the same shapes, as asked directly.

The gateway (``sluicegate serve --upstream``) passes ``tools``, ``tool_choice``
and ``parallel_tool_calls`` to its upstream, which constrains and parses the
calls, and rebuilds the client's stream from the upstream's ``tool_calls``
deltas. Two upstreams: a scripted sluicegate that writes two calls (exact
shapes), and sluicegate on the default model through llama.cpp, under the
grammar, at temperature 0 (greedy decoding writes the same call for the same
request, so the gateway's answer must equal the direct one, ids apart).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from sluicegate.model import DEFAULT_MODEL_ID

from .gateway import READ_TIMEOUT_S, api_base, is_idle, start_gateway, wait_for_stats
from .servers import ServerProcess, StartServer
from .test_tool_calls import ARGUMENTS, ASK, SCRIPT, TOOLS
from .wire import record_stream, stream_chunks

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SCRIPTED = "scripted"


def sdk_for(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=api_base(server), api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def scripted_upstream(
    start_server: StartServer, tmp_path_factory: pytest.TempPathFactory
) -> ServerProcess:
    script = Path(tmp_path_factory.mktemp("gateway-tools")) / "script.txt"
    script.write_text(SCRIPT, encoding="utf-8")
    return start_server(
        "scripted-tools-upstream",
        *("--engine", "scripted", "--scripted-rate", "2000"),
        *("--scripted-text", str(script), "--no-ledger"),
    )


@pytest.fixture(scope="module")
def scripted_gateway(
    start_server: StartServer, scripted_upstream: ServerProcess
) -> ServerProcess:
    return start_gateway(
        start_server, "gateway-tools", [api_base(scripted_upstream)], SCRIPTED
    )


def calls_of(message: Any) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def streamed_calls(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``delta.tool_calls`` entries of a stream, in order."""
    return [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or ()
    ]


def assert_local_shape(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Each call's first entry: index, id, type, name, ``arguments: ""``; later
    ones: index and arguments only; indexes from 0 in order. Returns each call's
    id, name and joined arguments."""
    calls: list[list[str]] = []
    for entry in entries:
        if "id" in entry:
            assert entry["index"] == len(calls), entries
            assert entry["type"] == "function"
            assert entry["id"].startswith("call_")
            assert set(entry["function"]) == {"name", "arguments"}
            assert entry["function"]["arguments"] == ""
            calls.append([entry["id"], entry["function"]["name"], ""])
        else:
            assert set(entry) == {"index", "function"}, entry
            assert set(entry["function"]) == {"arguments"}, entry
            assert 0 <= entry["index"] < len(calls)
            calls[entry["index"]][2] += entry["function"]["arguments"]
    ids = [call[0] for call in calls]
    assert len(set(ids)) == len(ids)
    return [(i, name, arguments) for i, name, arguments in calls]


# -- a scripted upstream: exact shapes ------------------------------------------


def test_non_streamed_calls_through_the_gateway_equal_the_direct_ones(
    scripted_upstream: ServerProcess, scripted_gateway: ServerProcess
) -> None:
    with sdk_for(scripted_upstream) as direct, sdk_for(scripted_gateway) as via:
        expected = direct.chat.completions.create(
            model=SCRIPTED, messages=ASK, tools=TOOLS
        )
        got = via.chat.completions.create(model=SCRIPTED, messages=ASK, tools=TOOLS)
    choice, want = got.choices[0], expected.choices[0]
    assert choice.finish_reason == want.finish_reason == "tool_calls"
    assert choice.message.content == want.message.content == "Checking.\n"
    assert calls_of(choice.message) == calls_of(want.message)
    assert calls_of(choice.message) == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    assert all(c.id.startswith("call_") for c in choice.message.tool_calls or ())


def test_streamed_calls_through_the_gateway_have_the_local_shape(
    scripted_upstream: ServerProcess, scripted_gateway: ServerProcess
) -> None:
    payload = {"model": SCRIPTED, "messages": ASK, "tools": TOOLS, "stream": True}
    with httpx.Client(timeout=READ_TIMEOUT_S) as client:
        direct = stream_chunks(
            record_stream(client, f"{scripted_upstream.base_url}{CHAT}", payload)
        )
        via = stream_chunks(
            record_stream(client, f"{scripted_gateway.base_url}{CHAT}", payload)
        )
    want = assert_local_shape(streamed_calls(direct))
    got = assert_local_shape(streamed_calls(via))
    assert [c[1:] for c in got] == [c[1:] for c in want]
    assert [c[1:] for c in got] == [("get_weather", ARGUMENTS), ("get_time", "{}")]
    finishes = [
        choice["finish_reason"]
        for chunk in via
        for choice in chunk["choices"]
        if choice["finish_reason"] is not None
    ]
    assert finishes == ["tool_calls"]
    content = "".join(
        choice["delta"].get("content") or "" for c in via for choice in c["choices"]
    )
    assert content == "Checking.\n"


def test_the_sdk_stream_helper_accumulates_the_same_calls_through_the_gateway(
    scripted_gateway: ServerProcess,
) -> None:
    with (
        sdk_for(scripted_gateway) as via,
        via.chat.completions.stream(model=SCRIPTED, messages=ASK, tools=TOOLS) as s,
    ):
        list(s)
        final = s.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert calls_of(final.choices[0].message) == [
        ("get_weather", ARGUMENTS),
        ("get_time", "{}"),
    ]


def test_parallel_tool_calls_false_reaches_the_upstream(
    scripted_upstream: ServerProcess, scripted_gateway: ServerProcess
) -> None:
    """The upstream, not the gateway, keeps only the first call."""
    kwargs: dict[str, Any] = {
        "model": SCRIPTED,
        "messages": ASK,
        "tools": TOOLS,
        "parallel_tool_calls": False,
    }
    with sdk_for(scripted_upstream) as direct, sdk_for(scripted_gateway) as via:
        want = direct.chat.completions.create(**kwargs).choices[0]
        got = via.chat.completions.create(**kwargs).choices[0]
    assert (
        calls_of(got.message) == calls_of(want.message) == [("get_weather", ARGUMENTS)]
    )
    assert got.finish_reason == want.finish_reason


# -- the default model, under the grammar -------------------------------------------


@pytest.fixture(scope="module")
def model_gateway(
    start_server: StartServer, llama_server: ServerProcess
) -> Iterator[ServerProcess]:
    gateway = start_gateway(
        start_server,
        "gateway-tools-llamacpp",
        [api_base(llama_server)],
        DEFAULT_MODEL_ID,
    )
    yield gateway
    wait_for_stats(gateway, is_idle)


REQUESTS = [
    # The tiny model may write a long city name: the call may run to the limit.
    pytest.param(
        {"tools": TOOLS[:1], "tool_choice": "required", "max_tokens": 48},
        {"tool_calls", "length"},
        id="required",
    ),
    pytest.param(
        {
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
            "max_tokens": 32,
        },
        {"tool_calls"},
        id="named",
    ),
    pytest.param(
        {"tools": TOOLS[:1], "tool_choice": "required", "max_tokens": 8},
        {"length"},  # never tool_calls for a call cut short
        id="cut",
    ),
]


@pytest.mark.llamacpp
@pytest.mark.timeout(300)  # four greedy answers under the grammar, on a busy CPU
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("tools", "finishes"), REQUESTS)
def test_the_models_calls_through_the_gateway_equal_the_direct_ones(
    llama_server: ServerProcess,
    model_gateway: ServerProcess,
    tools: dict[str, Any],
    finishes: set[str],
    stream: bool,
) -> None:
    kwargs: dict[str, Any] = {
        "model": DEFAULT_MODEL_ID,
        "messages": ASK,
        "temperature": 0,
        "seed": 7,
        **tools,
    }
    answers = []
    for server in (llama_server, model_gateway):
        with sdk_for(server) as client:
            if stream:
                with client.chat.completions.stream(**kwargs) as events:
                    list(events)  # get_final_completion() raises for "length"
                    answers.append(events.current_completion_snapshot.choices[0])
            else:
                answers.append(client.chat.completions.create(**kwargs).choices[0])
    want, got = answers
    assert got.finish_reason == want.finish_reason
    assert got.finish_reason in finishes
    assert calls_of(got.message) == calls_of(want.message)
    assert got.message.content == want.message.content
    assert not got.message.content
    calls = calls_of(got.message)
    if got.finish_reason == "tool_calls":
        assert calls
    # Parallel calls are allowed: every call but one that max_tokens cut is whole.
    whole = calls if got.finish_reason == "tool_calls" else calls[:-1]
    for _, arguments in whole:
        assert isinstance(json.loads(arguments), dict)
