"""Streamed and non-streamed answers agree: text, finish reasons, usage, logprobs.

For a fixed set of prompts (plain, multi-byte, with stop strings; chat and
completions) at temperature 0, the same request is sent with ``stream: true`` and
``stream: false`` one after the other, and everything the two answers carry is
compared. Logprob values may differ in the last digits (llama.cpp's arithmetic
depends on the batch), so they are compared to 1e-3.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from .wire import collect, complete, stream_chunks

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

CASES: list[tuple[str, dict[str, Any]]] = [
    (COMPLETIONS, {"prompt": "The quick brown fox", "max_tokens": 16}),
    (COMPLETIONS, {"prompt": "Café, naïve, 日本語, and 😀 are", "max_tokens": 16}),
    (
        COMPLETIONS,
        {
            "prompt": "Alice: Hi, Bob!\nBob: Hi,",
            "stop": ["\n", "Alice:"],
            "max_tokens": 12,
        },
    ),
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": "Say: café 日本語!"}],
            "max_tokens": 12,
        },
    ),
    (
        CHAT,
        {
            "messages": [{"role": "user", "content": "Count: one, two, three,"}],
            "stop": [" four", "\n"],
            "max_tokens": 12,
        },
    ),
]


def _streamed(
    http: httpx.Client, path: str, payload: dict[str, Any]
) -> tuple[str, str | None, dict[str, Any], list[tuple[str, float]]]:
    recorded, choices = collect(http, path, payload)
    chunks = stream_chunks(recorded)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    logprobs: list[tuple[str, float]] = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            lp = choice.get("logprobs")
            if not lp:
                continue
            if path == CHAT:
                logprobs += [(t["token"], t["logprob"]) for t in lp["content"]]
            else:
                logprobs += list(zip(lp["tokens"], lp["token_logprobs"], strict=True))
    return choices[0].text, choices[0].finish_reason, usage, logprobs


def _whole(
    http: httpx.Client, path: str, payload: dict[str, Any]
) -> tuple[str, str | None, dict[str, Any], list[tuple[str, float]]]:
    body = complete(http, path, payload)
    choice = body["choices"][0]
    lp = choice["logprobs"]
    if path == CHAT:
        text = choice["message"]["content"]
        logprobs = [(t["token"], t["logprob"]) for t in lp["content"]]
    else:
        text = choice["text"]
        logprobs = list(zip(lp["tokens"], lp["token_logprobs"], strict=True))
    return text, choice["finish_reason"], body["usage"], logprobs


@pytest.mark.parametrize(("path", "request_body"), CASES)
def test_stream_and_non_stream_carry_the_same_answer(
    http: httpx.Client, path: str, request_body: dict[str, Any]
) -> None:
    logprobs: dict[str, Any] = (
        {"logprobs": True, "top_logprobs": 1} if path == CHAT else {"logprobs": 1}
    )
    payload = {
        **request_body,
        **logprobs,
        "temperature": 0,
        "stream_options": {"include_usage": True},
    }
    s_text, s_finish, s_usage, s_lp = _streamed(http, path, payload)
    w_text, w_finish, w_usage, w_lp = _whole(http, path, payload)
    assert s_text == w_text
    assert "\ufffd" not in s_text
    assert s_finish == w_finish
    assert s_usage == w_usage
    assert [t for t, _ in s_lp] == [t for t, _ in w_lp]
    assert [p for _, p in s_lp] == pytest.approx([p for _, p in w_lp], abs=1e-3)
    assert len(s_lp) <= s_usage["completion_tokens"]
