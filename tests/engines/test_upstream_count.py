"""The gateway's prompt counter: one client, and routes an upstream does not
serve skipped until they are forgotten."""

from __future__ import annotations

import json

import httpx
import pytest

from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.count import FORGET_ABSENT_S, PromptCounter

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


def _counter(
    answer: dict[str, tuple[int, object]], clock: ManualClock
) -> tuple[PromptCounter, list[str]]:
    """A counter of an upstream answering ``answer[path]`` (404 elsewhere),
    and the paths it was asked, in order."""
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        status, body = answer.get(request.url.path, (404, {"error": "no route"}))
        return httpx.Response(status, content=json.dumps(body).encode())

    upstream = UpstreamConfig(url="http://upstream.test/v1")
    return PromptCounter(upstream, httpx.MockTransport(handle), clock), asked


@pytest.mark.anyio
async def test_an_upstream_without_a_counter_is_asked_once_until_forgotten() -> None:
    clock = ManualClock()
    counter, asked = _counter({}, clock)
    assert await counter.count("m", CHAT, {"model": "m"}) is None
    every = [
        "/v1/messages/count_tokens",
        "/tokenize",
        "/apply-template",
        "/chat_tokenize",
    ]
    assert asked == every
    assert await counter.count("m", CHAT, {"model": "m"}) is None
    assert asked == every  # each answered 404: none asked again
    clock.advance(FORGET_ABSENT_S)
    assert await counter.count("m", CHAT, {}) is None
    assert asked == every + every[1:]  # forgotten: asked again
    await counter.aclose()


@pytest.mark.anyio
async def test_a_failing_route_is_asked_again_past_absent_ones() -> None:
    clock = ManualClock()
    answers: dict[str, tuple[int, object]] = {
        "/tokenize": (503, {"error": "busy"}),
        "/chat_tokenize": (200, {"tokenize_response": [1, 2, 3]}),
    }
    counter, asked = _counter(answers, clock)
    assert await counter.count("m", CHAT, {}) == 3
    assert await counter.count("m", CHAT, {}) == 3
    # 503 is this request's failure, not an absent route; 404 is
    first = ["/tokenize", "/apply-template", "/chat_tokenize"]
    assert asked == [*first, "/tokenize", "/chat_tokenize"]
    await counter.aclose()


@pytest.mark.anyio
async def test_json_nested_too_deep_is_no_count() -> None:
    """A counter answering JSON too deep to decode is passed by (the standard
    library's decoder raised RecursionError out of the route: no answer)."""
    deep = "[" * 200_000

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/chat_tokenize":
            return httpx.Response(200, json={"tokenize_response": [1, 2]})
        return httpx.Response(200, content=deep.encode())

    upstream = UpstreamConfig(url="http://upstream.test/v1")
    counter = PromptCounter(upstream, httpx.MockTransport(handle), ManualClock())
    assert await counter.count("m", CHAT, {"model": "m"}) == 2
    await counter.aclose()
