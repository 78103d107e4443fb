"""Prefix reuse on the real model, as each API reports it.

A request whose prompt starts like the one before reuses that sequence's KV
cells: chat/completions says so in ``usage.prompt_tokens_details.cached_tokens``,
Responses in ``usage.input_tokens_details.cached_tokens``, Messages in
``usage.cache_read_input_tokens``. Reuse is off unless ``serve --prefix-cache``
is given, so this module starts its own server with it. A prompt partly read
from cells gets logits that differ in the last bits from one read whole, so the
warm answer's first token is compared with the cold one's by its logprob, within
a margin far wider than rounding and far narrower than cells at the wrong
positions would give.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from .servers import N_CTX, PARALLEL, ServerProcess, StartServer

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

LOGPROB_MARGIN = 0.1
"""How far the warm first token's logprob may be from the cold one's (nats)."""


@pytest.fixture(scope="module")
def reuse_server(start_server: StartServer) -> ServerProcess:
    """The default model through llama.cpp, with ``--prefix-cache``."""
    return start_server(
        "prefix-cache",
        "--log-level",
        "warning",
        "--engine",
        "llamacpp",
        "--n-ctx",
        str(N_CTX),
        "--parallel",
        str(PARALLEL),
        "--prefix-cache",
    )


@pytest.fixture(scope="module")
def reuse_sdk(reuse_server: ServerProcess) -> Iterator[openai.OpenAI]:
    url = f"{reuse_server.base_url}/v1"
    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    yield client
    client.close()


def _messages() -> list[Any]:
    # Its own text: no earlier request on the shared server starts like it.
    stamp = time.monotonic_ns()
    system = (
        f"Log {stamp}. You keep the lighthouse on the northern cape. Every night "
        "you write down the ships that pass, the weather, and the state of the lamp."
    )
    return [{"role": "user", "content": f"{system}\n\nWhat did you see tonight?"}]


def test_a_repeated_prompt_reports_cached_tokens_in_every_api(
    reuse_server: ServerProcess, reuse_sdk: openai.OpenAI, model_id: str
) -> None:
    sdk, base_url = reuse_sdk, reuse_server.base_url
    messages = _messages()
    chat: Any = {"model": model_id, "messages": messages, "max_tokens": 4}
    chat["temperature"] = 0
    cold = sdk.chat.completions.create(**chat, logprobs=True, top_logprobs=5)
    assert cold.usage is not None
    assert cold.usage.prompt_tokens_details is None  # nothing reused: not sent
    warm = sdk.chat.completions.create(**chat, logprobs=True, top_logprobs=5)
    assert warm.usage is not None
    assert warm.usage.prompt_tokens_details is not None
    cached = warm.usage.prompt_tokens_details.cached_tokens
    assert cached is not None
    assert 16 <= cached < warm.usage.prompt_tokens
    assert cold.choices[0].logprobs is not None
    assert cold.choices[0].logprobs.content
    assert warm.choices[0].logprobs is not None
    assert warm.choices[0].logprobs.content
    cold_top = {
        t.token: t.logprob for t in cold.choices[0].logprobs.content[0].top_logprobs
    }
    first = warm.choices[0].logprobs.content[0]
    assert first.token in cold_top, (first.token, cold_top)
    assert abs(first.logprob - cold_top[first.token]) < LOGPROB_MARGIN, (
        first,
        cold_top,
    )

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

    ask: Any = {"model": model_id, "messages": messages, "max_tokens": 4}
    with anthropic.Anthropic(base_url=base_url, api_key="x", max_retries=0) as claude:
        message = claude.messages.create(**ask, extra_body={"temperature": 0})
        # Streamed, message_start says the reuse as message_delta and the whole
        # answer do: Anthropic sends it once the prompt is read, and the local
        # engine knows its reuse at the first output.
        with claude.messages.stream(**ask) as stream:
            events = list(stream)
    assert message.usage.cache_read_input_tokens == cached
    start = next(e for e in events if e.type == "message_start").message.usage
    end = next(e for e in events if e.type == "message_delta").usage
    assert start.cache_read_input_tokens == end.cache_read_input_tokens == cached
    assert start.input_tokens == end.input_tokens == message.usage.input_tokens
