"""A prompt's tokens, counted by the upstream's own tokenizer.

``/v1/messages/count_tokens`` through the gateway asks the model's first
upstream, in this order, until one answers with a count:

::

    POST <url>/messages/count_tokens   the Messages body as the client sent it
                                       (sluicegate, llama-server's Anthropic
                                       routes): ``input_tokens``
    POST <root>/tokenize               ``{model, messages, tools,
                                       add_generation_prompt}`` (vLLM): ``count``
    POST <root>/apply-template, then   the messages through its chat template,
    POST <root>/tokenize               then that text (llama-server):
                                       ``len(tokens)``
    POST <root>/chat_tokenize          ``{model, messages, tools}`` (TGI):
                                       ``len(tokenize_response)``

``<root>`` is the API base without its ``/v1``. An upstream that answers none
of them with a count (Ollama, OpenAI) gives ``None``, and the route
refuses the request, naming the model, instead of answering a 0 that a client
cannot tell from a count. No redirect is followed; at most ``MAX_BYTES`` of an
answer are read; the whole count has one deadline.

Spec: Anthropic API reference, "Count tokens in a message"; vLLM's
``/tokenize``; llama.cpp's server README, ``/apply-template`` and
``/tokenize``; TGI's OpenAPI description, ``/chat_tokenize``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import httpx

from sluicegate.engines.upstream.config import UpstreamConfig

__all__ = ["MAX_BYTES", "TRIED", "count_prompt"]

MAX_BYTES = 1 << 20
"""Most bytes of one answer read."""

TRIED = (
    "<url>/messages/count_tokens, <root>/tokenize, <root>/apply-template,"
    " <root>/chat_tokenize"
)
"""What is asked, as a refusal names it."""


async def count_prompt(
    upstream: UpstreamConfig,
    model: str,
    chat: Mapping[str, Any],
    messages_body: Mapping[str, Any],
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int | None:
    """The prompt's tokens by ``upstream``'s tokenizer, or ``None`` when it
    offers no counter (see the module docstring).

    Args:
        upstream: the upstream asked.
        model: the model's name there.
        chat: the chat body the gateway would send (its ``messages`` and
            ``tools`` are counted).
        messages_body: the client's Messages body.
        timeout_s: the deadline of the whole count (seconds).
        transport: an httpx transport to use instead of the network (tests).
    """
    base = upstream.url.rstrip("/")
    root = base.removesuffix("/v1")
    headers = {}
    if upstream.api_key is not None:
        headers["Authorization"] = f"Bearer {upstream.api_key}"
    async with httpx.AsyncClient(
        timeout=timeout_s,
        transport=transport,
        trust_env=False,
        follow_redirects=False,
        headers=headers,
    ) as client:
        try:
            async with asyncio.timeout(timeout_s):
                return await _count(client, base, root, model, chat, messages_body)
        except TimeoutError:
            return None


async def _count(
    client: httpx.AsyncClient,
    base: str,
    root: str,
    model: str,
    chat: Mapping[str, Any],
    messages_body: Mapping[str, Any],
) -> int | None:
    if messages_body:  # the client's own Messages body, where there is one
        counted = await _post(
            client, base + "/messages/count_tokens", {**messages_body, "model": model}
        )
        if (found := _count_of(counted, "input_tokens")) is not None:
            return found
    asked: dict[str, Any] = {
        "model": model,
        "messages": chat.get("messages", []),
        "add_generation_prompt": True,
    }
    if chat.get("tools"):
        asked["tools"] = chat["tools"]
    if (
        found := _count_of(await _post(client, root + "/tokenize", asked), "count")
    ) is not None:
        return found
    applied = await _post(
        client, root + "/apply-template", {"messages": chat.get("messages", [])}
    )
    prompt = applied.get("prompt") if isinstance(applied, dict) else None
    if isinstance(prompt, str):
        tokens = await _post(
            client, root + "/tokenize", {"content": prompt, "add_special": True}
        )
        listed = tokens.get("tokens") if isinstance(tokens, dict) else None
        return len(listed) if isinstance(listed, list) else None
    tgi = await _post(client, root + "/chat_tokenize", asked)
    listed = tgi.get("tokenize_response") if isinstance(tgi, dict) else None
    return len(listed) if isinstance(listed, list) else None


def _count_of(answer: Any, name: str) -> int | None:
    value = answer.get(name) if isinstance(answer, dict) else None
    return value if type(value) is int and value >= 0 else None


async def _post(client: httpx.AsyncClient, url: str, body: Mapping[str, Any]) -> Any:
    """The JSON ``url`` answers ``body`` with 200, or ``None``."""
    try:
        async with client.stream("POST", url, json=dict(body)) as answer:
            if answer.status_code != 200:
                return None
            data = bytearray()
            async for piece in answer.aiter_bytes():
                data += piece
                if len(data) > MAX_BYTES:
                    return None
        return json.loads(data)
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None
