"""What an upstream tells of itself at start-up: its model's window, its kind.

``/v1/models`` shows each model's ``context_length``. For an upstream model the
file may set it; where it does not (and for ``--upstream`` pools), the server
asks the pool's first upstream once at start-up, within one deadline for every
model at once, where its dialect tells:

::

    vLLM, SGLang      GET <url>/models: the model's ``max_model_len``
    sluicegate        GET <url>/models: the model's ``context_length``
    llama-server      GET <root>/props: ``default_generation_settings.n_ctx``
                      (one slot's window: what one request may use)

The same ``/models`` entry's ``owned_by`` names the server's kind: ``vllm``
and ``sluicegate`` know ``stream_options.continuous_usage_stats``, so an
upstream whose configuration leaves ``continuous_usage`` unset gets it asked
for (``CONTINUOUS_USAGE_OWNERS``); others (SGLang before it learnt it, TGI,
llama-server, Ollama, OpenAI) are not sent it unless configured.

``<root>`` is the API base without its ``/v1``. Ollama's OpenAI routes tell
no window (the model's trained length, at ``/api/show``, is not the one it
runs with): set ``context_length`` in the file. An upstream that tells none,
answers otherwise or too late leaves it 0 (unknown), as before. No redirect is
followed; at most ``MAX_BYTES`` of an answer are read.

Spec: vLLM's ``ModelCard`` (``max_model_len``); llama.cpp's server README,
``GET /props``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from sluicegate.engines.upstream.config import UpstreamConfig

__all__ = [
    "CONTINUOUS_USAGE_OWNERS",
    "MAX_BYTES",
    "UpstreamFacts",
    "answer_json",
    "context_of_models",
    "context_of_props",
    "owner_of_models",
    "upstream_facts",
]

CONTINUOUS_USAGE_OWNERS = frozenset({"vllm", "sluicegate"})
"""``owned_by`` values of servers that report usage on every chunk when asked."""


@dataclass(frozen=True, slots=True)
class UpstreamFacts:
    """What one upstream told: its model's window (tokens) and its
    ``owned_by``, each ``None`` when it told none."""

    context_length: int | None = None
    owned_by: str | None = None


MAX_BYTES = 1 << 20
"""Most bytes of one answer read."""


def context_of_models(listing: Any, model: str) -> int | None:
    """The window a ``/models`` answer tells for ``model`` (tokens), or ``None``:
    its entry's ``max_model_len`` (vLLM, SGLang) or ``context_length``
    (sluicegate), a positive integer."""
    data = listing.get("data") if isinstance(listing, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and entry.get("id") == model:
            for name in ("max_model_len", "context_length"):
                value = entry.get(name)
                if type(value) is int and value > 0:
                    return value
    return None


def owner_of_models(listing: Any, model: str) -> str | None:
    """The ``owned_by`` a ``/models`` answer gives ``model`` (at most 64
    characters), or ``None``."""
    data = listing.get("data") if isinstance(listing, dict) else None
    for entry in data if isinstance(data, list) else ():
        if isinstance(entry, dict) and entry.get("id") == model:
            owner = entry.get("owned_by")
            if type(owner) is str and len(owner) <= 64:
                return owner
    return None


def context_of_props(props: Any) -> int | None:
    """The window llama-server's ``/props`` tells (tokens), or ``None``:
    ``default_generation_settings.n_ctx``, a positive integer."""
    settings = (
        props.get("default_generation_settings") if isinstance(props, dict) else None
    )
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    return value if type(value) is int and value > 0 else None


def upstream_facts(
    upstreams: Sequence[tuple[UpstreamConfig, str]],
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[UpstreamFacts]:
    """What each upstream tells of its model; all asked at once, within one
    deadline of ``timeout_s`` seconds (one that answers too late told nothing).

    Args:
        upstreams: ``(upstream, its name of the model)`` pairs.
        timeout_s: the deadline of the whole look-up (seconds).
        transport: an httpx transport to use instead of the network (tests).
    """
    return asyncio.run(_all(upstreams, timeout_s, transport))


async def _all(
    upstreams: Sequence[tuple[UpstreamConfig, str]],
    timeout_s: float,
    transport: httpx.AsyncBaseTransport | None,
) -> list[UpstreamFacts]:
    async with httpx.AsyncClient(
        timeout=timeout_s, transport=transport, trust_env=False, follow_redirects=False
    ) as client:
        tasks = [
            asyncio.ensure_future(_one(client, upstream, model))
            for upstream, model in upstreams
        ]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        found = [t.result() if t.done() else UpstreamFacts() for t in tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return found


async def _one(
    client: httpx.AsyncClient, upstream: UpstreamConfig, model: str
) -> UpstreamFacts:
    base = upstream.url.rstrip("/")
    headers = {}
    if upstream.api_key is not None:
        headers["Authorization"] = f"Bearer {upstream.api_key}"
    listing = await _get(client, base + "/models", headers)
    owner = owner_of_models(listing, model)
    found = context_of_models(listing, model)
    if found is None:
        root = base.removesuffix("/v1")
        found = context_of_props(await _get(client, root + "/props", headers))
    return UpstreamFacts(found, owner)


async def _get(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> Any:
    """The JSON ``url`` answers with 200, or ``None``."""
    return (await answer_json(client, "GET", url, headers=headers))[1]


async def answer_json(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    body: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> tuple[int | None, Any]:
    """The status ``url`` answers ``method`` (with JSON ``body``) with, and
    the JSON of a 200 answer of at most ``MAX_BYTES`` (else ``None``); the
    status is ``None`` when no answer came (a connection or URL error). JSON
    nested deeper than orjson's 1,024 levels is no JSON here (``json.loads``
    raised ``RecursionError`` on it, out of every caller)."""
    try:
        async with client.stream(
            method, url, json=None if body is None else dict(body), headers=headers
        ) as answer:
            if answer.status_code != 200:
                return answer.status_code, None
            data = bytearray()
            async for piece in answer.aiter_bytes():
                data += piece
                if len(data) > MAX_BYTES:
                    return answer.status_code, None
        return answer.status_code, orjson.loads(data)
    except ValueError:  # not JSON (orjson.JSONDecodeError is one)
        return 200, None
    except (httpx.HTTPError, httpx.InvalidURL):
        return None, None
