"""Fewer writes: ``--stream-interval`` and ``stream_options.stream_interval``
(content every N tokens, the first at once), and one write per loop turn.

Tokens per chunk are counted by their logprobs (one entry per token), so the
counts do not depend on how the scripted text is split into tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, COMPLETIONS, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio

STREAM: dict[str, Any] = {
    "messages": HELLO,
    "stream": True,
    "logprobs": True,
    "stream_options": {"include_usage": True},
}


def _tokens_per_chunk(ex: Exchange) -> list[int]:
    """Per content chunk, how many tokens it carries (by its logprobs)."""
    counts = []
    for payload in ex.payloads():
        for choice in payload.get("choices", []):
            content = (choice.get("logprobs") or {}).get("content")
            if content:
                counts.append(len(content))
    return counts


def _ending(ex: Exchange) -> tuple[Any, ...]:
    payloads = ex.payloads()
    reasons = [c["finish_reason"] for p in payloads for c in p.get("choices", [])]
    return (
        "".join(ex.contents()),
        [r for r in reasons if r is not None],
        payloads[-1]["usage"],
        ex.done_count(),
    )


@pytest.mark.parametrize("every", [2, 4, 7])
async def test_a_request_stream_interval_sends_the_first_token_then_every_n(
    every: int,
) -> None:
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    plain = await exchange(app, CHAT, STREAM)
    options = {"include_usage": True, "stream_interval": every}
    batched = await exchange(app, CHAT, {**STREAM, "stream_options": options})
    counts = _tokens_per_chunk(batched)
    assert counts[0] == 1  # the first token at once
    assert all(n >= every for n in counts[1:-1])  # then every N (or more: behind)
    assert sum(counts) == sum(_tokens_per_chunk(plain))
    assert len(counts) <= 2 + (sum(counts) - 1) // every
    assert _ending(batched) == _ending(plain)  # text, finish, usage, [DONE]
    assert "".join(batched.contents()) == DEFAULT_TEXT


async def test_the_server_stream_interval_applies_and_a_request_overrides_it() -> None:
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig(stream_interval=5))
    batched = await exchange(app, CHAT, STREAM)
    counts = _tokens_per_chunk(batched)
    assert counts[0] == 1
    assert all(n >= 5 for n in counts[1:-1])
    one = {"include_usage": True, "stream_interval": 1}
    plain = await exchange(app, CHAT, {**STREAM, "stream_options": one})
    assert len(_tokens_per_chunk(plain)) > len(counts)
    assert _ending(batched) == _ending(plain)


async def test_a_stream_interval_keeps_a_stop_string_held_back() -> None:
    # The stop string's first characters arrive tokens before it is matched:
    # batched or not, none of it is sent, and the text ends where it starts.
    stop = DEFAULT_TEXT[20:26]
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    body = {"prompt": "Hi", "stream": True, "stop": [stop]}
    plain = await exchange(app, COMPLETIONS, body)
    batched = await exchange(
        app, COMPLETIONS, {**body, "stream_options": {"stream_interval": 3}}
    )
    expected = DEFAULT_TEXT[: DEFAULT_TEXT.index(stop)]
    assert "".join(batched.contents()) == "".join(plain.contents()) == expected
    assert batched.payloads()[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("every", [0, 1001])
async def test_a_stream_interval_out_of_range_is_a_400(every: int) -> None:
    app = create_app(ScriptedEngine(), ServerConfig())
    options = {"stream_interval": every}
    ex = await exchange(app, CHAT, {**STREAM, "stream_options": options})
    assert ex.status == 400
    with pytest.raises(ValueError, match="stream_interval"):
        ServerConfig(stream_interval=every)


async def test_the_end_of_a_stream_goes_out_in_one_write() -> None:
    # The finish, the usage and [DONE] come from one engine callback: one body
    # message, not one per event.
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    ex = await exchange(app, CHAT, STREAM)
    bodies = [m["body"] for m in ex.messages if m["type"] == "http.response.body"]
    last = [b for b in bodies if b][-1]
    assert b'"finish_reason":"stop"' in last
    assert b'"usage"' in last
    assert last.endswith(b"data: [DONE]\n\n")


async def test_a_resumable_stream_keeps_its_requests_stream_interval() -> None:
    # Its producer batches the log's frames as a live stream batches its own.
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    options = {"include_usage": True, "resumable": True, "stream_interval": 3}
    ex = await exchange(app, CHAT, {**STREAM, "stream_options": options})
    counts = _tokens_per_chunk(ex)
    assert counts[0] == 1
    assert all(n >= 3 for n in counts[1:-1])
    assert "".join(ex.contents()) == DEFAULT_TEXT


async def test_a_responses_stream_interval_sends_fewer_deltas_of_the_same_text() -> (
    None
):
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    body: dict[str, Any] = {"model": "scripted", "input": "Hi", "stream": True}
    plain = await exchange(app, "/v1/responses", body)
    options = {"stream_interval": 4}
    batched = await exchange(app, "/v1/responses", {**body, "stream_options": options})

    def deltas(ex: Exchange) -> list[str]:
        kind = "response.output_text.delta"
        return [p["delta"] for p in ex.payloads() if p.get("type") == kind]

    assert "".join(deltas(batched)) == "".join(deltas(plain)) == DEFAULT_TEXT
    assert len(deltas(batched)) < len(deltas(plain))
    assert batched.payloads()[-1]["type"] == plain.payloads()[-1]["type"]
