"""Chunk shapes on the real model: finish reasons, usage, [DONE] and n > 1."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .wire import (
    NO_END_TOKENS,
    check_chunks,
    collect,
    complete,
    record_stream,
    stream_chunks,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"


def test_usage_is_one_last_chunk_with_no_choices(http: httpx.Client) -> None:
    """With include_usage exactly one chunk, the last, carries usage.

    Greedy decoding (temperature 0) makes the stream's token counts comparable
    with those of the same request sent with ``stream: false``.
    """
    payload: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    recorded = record_stream(http, CHAT, {**payload, "stream": True})
    chunks = stream_chunks(recorded)
    check_chunks(chunks, chat=True)
    body = complete(http, CHAT, payload)

    *others, last = chunks
    assert last["choices"] == []
    assert last["usage"] == body["usage"]
    usage = last["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 0 < usage["completion_tokens"] <= 16
    for chunk in others:
        assert "usage" in chunk, chunk
        assert chunk["usage"] is None, chunk


def test_no_chunk_carries_usage_unless_asked(http: httpx.Client) -> None:
    """Without stream_options.include_usage no chunk has a usage value."""
    payload = {
        "messages": [{"role": "user", "content": "Say hello in five words."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    recorded, _ = collect(http, CHAT, payload)
    chunks = stream_chunks(recorded)
    assert all(chunk.get("usage") is None for chunk in chunks), chunks
    assert all(chunk["choices"] for chunk in chunks), chunks


def test_finish_reason_is_null_except_once_per_choice(http: httpx.Client) -> None:
    """``finish_reason`` is on every choice, non-null once, stop or length.

    ``check_chunks`` asserts the whole contract, including role in the first chunk.
    """
    payload = {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}
    recorded, choices = collect(http, CHAT, payload)
    chunks = stream_chunks(recorded)

    assert list(choices) == [0]
    assert choices[0].finish_reason in ("stop", "length")
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert sum(r is not None for r in reasons) == 1
    assert "" not in reasons


def test_length_finish_is_the_last_choice_chunk(http: httpx.Client) -> None:
    """``max_tokens`` reached: the last chunk with choices says length.

    The request samples (no temperature, no seed); the end tokens are banned so
    that no draw ends the answer before ``max_tokens``.
    """
    payload = {
        "messages": [{"role": "user", "content": "Count from 1 to 50."}],
        "max_tokens": 5,
        "logit_bias": NO_END_TOKENS,
    }
    recorded, choices = collect(http, CHAT, payload)
    with_choices = [c for c in stream_chunks(recorded) if c["choices"]]

    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    assert choices[0].finish_reason == "length"
    assert choices[0].text


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_tiny_max_tokens_streams_every_token(
    http: httpx.Client, max_tokens: int
) -> None:
    """``max_tokens`` 1, 2 and 3: the generated text is sent, then length.

    Greedy decoding keeps the first tokens the same on every run; the end tokens
    are banned (one would end the answer with no text), so that every token is
    text whatever the machine's model prefers.
    """
    payload = {
        "messages": [{"role": "user", "content": "Write me a story about a fox."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logit_bias": NO_END_TOKENS,
        "stream_options": {"include_usage": True},
    }
    recorded, choices = collect(http, CHAT, payload)
    usage = stream_chunks(recorded)[-1]["usage"]

    assert choices[0].finish_reason == "length"
    assert choices[0].text, "the generated token's text was not streamed"
    assert usage["completion_tokens"] == max_tokens


def test_done_is_sent_once_after_both_choices_finish(http: httpx.Client) -> None:
    """``n=2`` gives both indices one finish each, then a single [DONE].

    The choices are sampled; with the end tokens banned neither can end empty.
    """
    payload = {
        "prompt": "Once upon a time",
        "n": 2,
        "max_tokens": 16,
        "logit_bias": NO_END_TOKENS,
    }
    recorded, choices = collect(http, "/v1/completions", payload)

    assert recorded.events.count("[DONE]") == 1
    assert recorded.events[-1] == "[DONE]"
    assert sorted(choices) == [0, 1]
    for index in (0, 1):
        assert choices[index].finish_reason in ("stop", "length")
        assert choices[index].text
