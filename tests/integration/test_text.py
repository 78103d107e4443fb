"""Tokens are not text: what the real model streams decodes to whole characters."""

from __future__ import annotations

import httpx
import pytest

from .wire import (
    assert_deltas_not_cumulative,
    assert_whole_characters,
    collect,
    complete,
    response_text,
)

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def test_multi_byte_characters_stream_whole(http: httpx.Client) -> None:
    """Emoji, accents and CJK come out as whole characters, never U+FFFD."""
    payload = {
        "messages": [
            {
                "role": "user",
                "content": "Reply with exactly these characters and nothing else: "
                "😀🔥👍 café 日本語 ðŸ",
            }
        ],
        "temperature": 0,
        "max_tokens": 32,
    }
    path = "/v1/chat/completions"
    recorded, choices = collect(http, path, payload)
    body = complete(http, path, payload)

    recorded.body.decode("utf-8")  # the raw SSE bytes are valid UTF-8
    assert_whole_characters(choices[0].deltas)
    assert choices[0].text == response_text(body)


def test_spaces_survive_token_by_token_decoding(http: httpx.Client) -> None:
    """The joined deltas keep every space the whole decode has."""
    payload = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 0}
    _, choices = collect(http, "/v1/completions", payload)
    whole = response_text(complete(http, "/v1/completions", payload))

    assert " " in whole, whole
    assert choices[0].text == whole


def test_deltas_are_increments_not_cumulative_text(http: httpx.Client) -> None:
    """The delta lengths add up to the final text's length."""
    payload = {"prompt": "Where is New York?", "max_tokens": 16, "temperature": 0}
    _, choices = collect(http, "/v1/completions", payload)
    whole = response_text(complete(http, "/v1/completions", payload))

    assert len(choices[0].deltas) > 1, choices[0].deltas
    assert_deltas_not_cumulative(choices[0].deltas, whole)


@pytest.mark.parametrize(
    "max_tokens",
    [
        pytest.param(24, id="ends-inside-a-character"),
        pytest.param(22, id="ends-on-a-whole-character"),
    ],
)
def test_characters_split_across_byte_tokens_stream_whole(
    http: httpx.Client, max_tokens: int
) -> None:
    """Emoji the vocabulary only has as byte tokens are never cut in half.

    The default model answers with one token per byte, in a 9-token period
    (``🪼``, space, ``🦩``). 22 tokens end on the last byte of a ``🪼``; 24 end
    on the first byte of a ``🦩`` that the length limit cuts off.
    """
    payload = {
        "prompt": "🦩🪼 🦩🪼 🦩🪼 🦩🪼 🦩",
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    recorded, choices = collect(http, "/v1/completions", payload)
    whole = response_text(complete(http, "/v1/completions", payload))

    recorded.body.decode("utf-8")
    assert_whole_characters(choices[0].deltas)
    assert choices[0].text == whole
    assert "🪼" in whole or "🦩" in whole, whole
