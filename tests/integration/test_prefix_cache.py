"""Prefix reuse on the real model, as each API reports it.

A request whose prompt starts like the one before reuses that sequence's KV
cells: chat/completions says so in ``usage.prompt_tokens_details.cached_tokens``,
Responses in ``usage.input_tokens_details.cached_tokens``, Messages in
``usage.cache_read_input_tokens``; greedy text is the same as when the prompt
was read whole, on the same server.
"""

from __future__ import annotations

import time
from typing import Any

import anthropic
import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


def _messages() -> list[Any]:
    # Its own text: no earlier request on the shared server starts like it.
    stamp = time.monotonic_ns()
    system = (
        f"Log {stamp}. You keep the lighthouse on the northern cape. Every night "
        "you write down the ships that pass, the weather, and the state of the lamp."
    )
    return [{"role": "user", "content": f"{system}\n\nWhat did you see tonight?"}]


def test_a_repeated_prompt_reports_cached_tokens_in_every_api(
    sdk: openai.OpenAI, base_url: str, model_id: str
) -> None:
    messages = _messages()
    chat: Any = {"model": model_id, "messages": messages, "max_tokens": 4}
    chat["temperature"] = 0
    cold = sdk.chat.completions.create(**chat)
    assert cold.usage is not None
    assert cold.usage.prompt_tokens_details is None  # nothing reused: not sent
    warm = sdk.chat.completions.create(**chat)
    assert warm.usage is not None
    assert warm.usage.prompt_tokens_details is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 16 <= cached < warm.usage.prompt_tokens
    assert warm.choices[0].message.content == cold.choices[0].message.content

    chunks = list(
        sdk.chat.completions.create(
            **chat, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == cached

    response = sdk.responses.create(
        model=model_id, input=messages, max_output_tokens=4, temperature=0
    )
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == cached

    with anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0) as claude:
        message = claude.messages.create(
            model=model_id,
            messages=messages,
            max_tokens=4,
            extra_body={"temperature": 0},
        )
    assert message.usage.cache_read_input_tokens == cached
