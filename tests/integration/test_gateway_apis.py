"""The Messages and Responses APIs through a gateway: a chat-only hop serves both.

The gateway (``sluicegate serve --upstream``) translates a Messages or
Responses request into chat, asks its upstream (sluicegate on the default model
through llama.cpp) for a chat stream, and writes each API's own events from the
upstream's deltas. At temperature 0 the answers through the gateway equal the
direct ones; a client that closes its stream at the gateway aborts the engine
behind it; a background response at the gateway is kept and resumed there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from sluicegate.model import DEFAULT_MODEL_ID

from .gateway import api_base, is_idle, start_gateway, wait_for_stats
from .servers import ServerProcess, StartServer
from .test_disconnect import assert_aborted, new_running_id
from .wire import RawExchange, engine_stats

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

GREEDY = {"temperature": 0}
ASK: Any = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def gateway(start_server: StartServer, llama_server: ServerProcess) -> ServerProcess:
    return start_gateway(
        start_server, "gateway-apis", [api_base(llama_server)], DEFAULT_MODEL_ID
    )


@pytest.fixture(autouse=True)
def nothing_runs_after_the_test(
    gateway: ServerProcess, llama_server: ServerProcess
) -> Iterator[None]:
    yield
    wait_for_stats(gateway, is_idle)
    wait_for_stats(llama_server, is_idle)


_OPEN: list[anthropic.Anthropic | openai.OpenAI] = []
"""The SDK clients a test made: closed after it, so that no socket is left for
the garbage collector to find (a ResourceWarning, an error here) in a later
test."""


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def claude(server: ServerProcess) -> anthropic.Anthropic:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    _OPEN.append(client)
    return client


def sdk(server: ServerProcess) -> openai.OpenAI:
    client = openai.OpenAI(base_url=api_base(server), api_key="x", max_retries=0)
    _OPEN.append(client)
    return client


def test_a_message_through_the_gateway_equals_the_direct_one(
    gateway: ServerProcess, llama_server: ServerProcess
) -> None:
    kw: Any = {"model": DEFAULT_MODEL_ID, "max_tokens": 24, "messages": ASK}
    direct = claude(llama_server).messages.create(**kw, extra_body=GREEDY)
    hop = claude(gateway)
    whole = hop.messages.create(**kw, extra_body=GREEDY)
    assert whole.content[0].text == direct.content[0].text
    assert (whole.stop_reason, whole.usage.output_tokens) == (
        direct.stop_reason,
        direct.usage.output_tokens,
    )
    events: list[Any] = list(hop.messages.create(**kw, stream=True, extra_body=GREEDY))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    text = "".join(
        e.delta.text
        for e in events
        if e.type == "content_block_delta" and e.delta.type == "text_delta"
    )
    assert text == direct.content[0].text
    assert events[-2].delta.stop_reason == direct.stop_reason
    assert events[-2].usage.output_tokens == direct.usage.output_tokens


def test_a_response_through_the_gateway_equals_the_direct_one(
    gateway: ServerProcess, llama_server: ServerProcess
) -> None:
    kw: Any = {
        "model": DEFAULT_MODEL_ID,
        "input": ASK,
        "max_output_tokens": 24,
        "temperature": 0,
    }
    direct = sdk(llama_server).responses.create(**kw)
    hop = sdk(gateway)
    whole = hop.responses.create(**kw)
    assert whole.output_text == direct.output_text
    assert whole.status == direct.status
    events: list[Any] = list(hop.responses.create(**kw, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == f"response.{direct.status}"
    assert events[-1].response.output_text == direct.output_text


def test_a_background_response_at_the_gateway_is_kept_and_resumed_there(
    gateway: ServerProcess,
) -> None:
    hop = sdk(gateway)
    created = hop.responses.create(
        model=DEFAULT_MODEL_ID, input=ASK, max_output_tokens=16, background=True
    )
    deadline = time.monotonic() + 60
    while (final := hop.responses.retrieve(created.id)).status == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    events: list[Any] = list(
        hop.responses.retrieve(created.id, stream=True, starting_after=1)
    )
    assert events[0].sequence_number == 2
    assert events[-1].response.output_text == final.output_text


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/responses"])
def test_closing_a_stream_at_the_gateway_aborts_the_engine_behind_it(
    path: str, gateway: ServerProcess, llama_server: ServerProcess
) -> None:
    ask = "Write a long story."
    body: dict[str, Any] = {"model": DEFAULT_MODEL_ID, "stream": True}
    if path == "/v1/messages":
        body |= {"max_tokens": 1024, "messages": [{"role": "user", "content": ask}]}
    else:
        body |= {"max_output_tokens": 1024, "input": ask}
    deltas = ("content_block_delta", "response.output_text.delta")
    with httpx.Client(base_url=llama_server.base_url, timeout=30) as upstream:
        before = engine_stats(upstream)
        started_s = time.monotonic()
        with RawExchange(gateway.base_url, path, body) as exchange:
            assert exchange.read_response().status_code == 200
            for event in exchange.iter_events():
                if json.loads(event)["type"] in deltas:
                    break
            request_id, _ = new_running_id(upstream, before, started_s)
            closed_at_s = exchange.close()
        assert_aborted(upstream, request_id, closed_at_s, before)
