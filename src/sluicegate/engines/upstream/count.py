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
answer are read; the whole count has one deadline, and a counter that does
not answer within it raises ``TimeoutError`` (slow, not absent: it is asked
again next time).

A ``PromptCounter`` keeps one HTTP client for its upstream's life and skips a
route the upstream answered 404, 405 or 501 for ``FORGET_ABSENT_S``: an
upstream with no counter (Ollama) is otherwise asked four times per request
that wants a count, on new connections, before the estimate stands in.

Spec: Anthropic API reference, "Count tokens in a message"; vLLM's
``/tokenize``; llama.cpp's server README, ``/apply-template`` and
``/tokenize``; TGI's OpenAPI description, ``/chat_tokenize``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.context import MAX_BYTES, answer_json

__all__ = ["FORGET_ABSENT_S", "MAX_BYTES", "TRIED", "PromptCounter"]


TRIED = (
    "<url>/messages/count_tokens, <root>/tokenize, <root>/apply-template,"
    " <root>/chat_tokenize"
)
"""What is asked, as a refusal names it."""
FORGET_ABSENT_S = 300.0
"""How long a route the upstream does not serve is skipped (seconds, on the
event loop's clock); then it is asked again, in case the upstream changed."""
ABSENT_STATUSES = frozenset((404, 405, 501))
"""Answers that say a route is not served (not that this request failed)."""


class PromptCounter:
    """Counts prompts with one upstream's tokenizer (the routes above).

    Args:
        upstream: the upstream asked.
        transport: an httpx transport to use instead of the network (tests).
        timers: the clock of ``FORGET_ABSENT_S`` and of a count's deadline
            (the running loop when ``None``; a ``ManualClock`` in tests).
    """

    __slots__ = ("_absent", "_client", "_root", "_timers", "_transport", "_upstream")

    def __init__(
        self,
        upstream: UpstreamConfig,
        transport: httpx.AsyncBaseTransport | None = None,
        timers: Timers | None = None,
    ) -> None:
        self._upstream = upstream
        self._transport = transport
        self._timers = timers
        self._client: httpx.AsyncClient | None = None
        self._absent: dict[str, float] = {}  # url -> loop time it answered absent
        self._root = upstream.url.rstrip("/").removesuffix("/v1")

    async def count(
        self,
        model: str,
        chat: Mapping[str, Any],
        messages_body: Mapping[str, Any],
        timeout_s: float | None = 10.0,
    ) -> int | None:
        """The prompt's tokens by the upstream's tokenizer, or ``None`` when it
        offers no counter.

        Args:
            model: the model's name there.
            chat: the chat body the gateway would send (its ``messages`` and
                ``tools`` are counted).
            messages_body: the client's Messages body (``{}``: none).
            timeout_s: the deadline of the whole count (seconds; ``None``:
                none).

        Raises:
            TimeoutError: no count and no refusal within ``timeout_s``.
        """
        if self._client is None:  # made on the event loop, once
            headers = {}
            if self._upstream.api_key is not None:
                headers["Authorization"] = f"Bearer {self._upstream.api_key}"
            self._client = httpx.AsyncClient(
                transport=self._transport,
                timeout=None,  # the count's own deadline rules
                trust_env=False,
                follow_redirects=False,
                headers=headers,
            )
        if timeout_s is None:
            return await self._count(model, chat, messages_body)
        timers = self._timers or asyncio.get_running_loop()
        async with Deadline(timers, timeout_s):
            return await self._count(model, chat, messages_body)

    async def aclose(self) -> None:
        """Close the client (a later ``count`` makes a new one)."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def _count(
        self, model: str, chat: Mapping[str, Any], messages_body: Mapping[str, Any]
    ) -> int | None:
        base, root = self._upstream.url.rstrip("/"), self._root
        if messages_body:  # the client's own Messages body, where there is one
            counted = await self._post(
                base + "/messages/count_tokens", {**messages_body, "model": model}
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
        tokenized = await self._post(root + "/tokenize", asked)
        if (found := _count_of(tokenized, "count")) is not None:
            return found
        applied = await self._post(
            root + "/apply-template", {"messages": chat.get("messages", [])}
        )
        prompt = applied.get("prompt") if isinstance(applied, dict) else None
        if isinstance(prompt, str):
            tokens = await self._post(
                root + "/tokenize", {"content": prompt, "add_special": True}
            )
            listed = tokens.get("tokens") if isinstance(tokens, dict) else None
            return len(listed) if isinstance(listed, list) else None
        tgi = await self._post(root + "/chat_tokenize", asked)
        listed = tgi.get("tokenize_response") if isinstance(tgi, dict) else None
        return len(listed) if isinstance(listed, list) else None

    async def _post(self, url: str, body: Mapping[str, Any]) -> Any:
        """The JSON ``url`` answers ``body`` with 200, or ``None``; a route
        learnt absent is not asked until ``FORGET_ABSENT_S`` has passed."""
        now = (self._timers or asyncio.get_running_loop()).time()
        if now - self._absent.get(url, -FORGET_ABSENT_S) < FORGET_ABSENT_S:
            return None
        assert self._client is not None  # count() made it
        status, found = await answer_json(self._client, "POST", url, body=body)
        if status in ABSENT_STATUSES:
            self._absent[url] = now
        return found


def _count_of(answer: Any, name: str) -> int | None:
    value = answer.get(name) if isinstance(answer, dict) else None
    return value if type(value) is int and value >= 0 else None
