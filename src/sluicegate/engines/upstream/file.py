"""Upstream models from the command line and from a TOML config file.

``sluicegate serve --upstream URL`` (repeatable) serves one model from a pool of
OpenAI-compatible servers (named by ``--upstream-model``, or else the one model
the pool lists, ``served_model``); ``--upstreams FILE`` serves any number, each
with its own pool, in the format below. Both may be given; every model id is
unique.

::

    [[models]]
    id = "llama-3.1-8b"                # what clients ask for (required)
    context_length = 131072            # shown in /v1/models (default 0: unknown)
    max_queued = 256                   # requests that wait for a free stream
    queue_timeout_s = 30               # the longest such wait, then 503
    eject_after_failures = 3           # passive ejection ...
    cooldown_s = 10                    # ... and how long it lasts
    health_interval_s = 5              # active checks (0: none)

    [[models.upstreams]]
    url = "http://10.0.0.5:8000/v1"    # an OpenAI-compatible API base (required)
    model = "meta-llama/Llama-3.1-8B-Instruct"   # its name there (default: id)
    api_key_env = "VLLM_API_KEY"       # the variable holding its key
    max_streams = 64                   # streams in flight on it at most
    continuous_usage = true            # usage on every chunk (unset: by its kind)
    logprobs = false                   # it gives none: refuse them with a 400
    connect_timeout_s = 5
    first_token_timeout_s = 120
    idle_timeout_s = 60
    total_timeout_s = 600              # or leave out: no total limit
    count_timeout_s = 10               # its token counter (count_tokens)
    max_line_bytes = 1048576           # the reader's bounds (docs/security.md,
    max_event_bytes = 1048576          # "Upstream reader limits"): an SSE line,
    max_deltas_per_chunk = 1024        # an event's data, a chunk's choices and
    max_tool_calls = 128               # tool-call entries, a choice's calls,
    max_response_bytes = 268435456     # the whole body

Spec: TOML v1.0.0; the upstream settings are ``upstream_from_dict``'s.
"""

from __future__ import annotations

import asyncio
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from sluicegate.core.redact import redact_url
from sluicegate.engines.base import ModelInfo
from sluicegate.engines.upstream.engine import UpstreamEngine

__all__ = [
    "MODELS_MAX_BYTES",
    "engine_from_urls",
    "engines_from_file",
    "list_models",
    "served_model",
]

_MODEL_KEYS = {
    "max_queued": int,
    "queue_timeout_s": float,
    "eject_after_failures": int,
    "cooldown_s": float,
    "health_interval_s": float,
}


def engine_from_urls(
    urls: Sequence[str], model_id: str, upstream_model: str | None
) -> UpstreamEngine:
    """One engine serving ``model_id`` from the pool ``urls``.

    Args:
        urls: API bases, e.g. ``http://10.0.0.5:8000/v1`` (>= 1).
        model_id: the id clients use.
        upstream_model: the model's name on the upstreams; ``None``: ``model_id``.

    Raises:
        ValueError: a URL that is not http(s).
    """
    spec: dict[str, Any] = {"model": upstream_model} if upstream_model else {}
    return UpstreamEngine.from_config(
        _model_info(model_id, 0), [{"url": url, **spec} for url in urls], {}
    )


MODELS_MAX_BYTES = 1 << 20
"""Most bytes of an upstream's model list that discovery reads."""
_BASE_HINT = "use --upstream "
"""How a failure names the base that lists models where the one given did not."""


def served_model(
    urls: Sequence[str],
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> str:
    """The id of the one model the pool ``urls`` serves: ``GET {url}/models``
    of the first URL (in order) that answers it (OpenAI's "List models").

    Args:
        urls: API bases, e.g. ``http://10.0.0.5:8000/v1`` (>= 1), asked at once.
        timeout_s: the deadline of the whole discovery (seconds), however the
            answers come: a list dripped a byte at a time is cut off by it.
        transport: an httpx transport to use instead of the network (tests).

    Raises:
        ValueError: no URL answered 200 with a model list in time, or the list
            does not hold exactly one model (the message names them, or why
            each URL failed, each by its ``redact_url``; it says to pass
            ``--upstream-model`` where that applies: several models listed, or
            no answer, but not beside a base that lists models once ``/v1`` is
            added, where it says which base to pass instead).
    """
    results = list_models(urls, timeout_s, transport)
    for listing, ids in results:
        if isinstance(ids, str):
            continue
        if len(ids) == 1:
            return ids[0]
        listed = ", ".join(map(repr, ids)) if ids else "none"
        raise ValueError(
            f"{listing} lists {len(ids)} models ({listed}): pass "
            "--upstream-model NAME to say which one to serve"
        )
    failures = "; ".join(f"{listing}: {why}" for listing, why in results)
    what = "could not ask the upstreams which model they serve"
    if any(_BASE_HINT in why for _, why in results):
        # A base that lacks /v1: --upstream-model would skip this discovery,
        # not mend the base; the hint beside it is what applies.
        raise ValueError(f"{what}: {failures}")
    raise ValueError(
        f"{what} ({failures}): pass --upstream-model NAME to serve without asking"
    )


def list_models(
    urls: Sequence[str],
    timeout_s: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[tuple[str, list[str] | str]]:
    """Each upstream's model ids (``GET {url}/models``), or why there are none.

    Every URL is asked at once, all within one deadline of ``timeout_s``
    seconds; no redirect is followed; at most ``MODELS_MAX_BYTES`` of a list
    are read. A base that answered 404 without ``/v1`` at the end of its path,
    or that has no scheme, most likely lacks them (``10.0.0.5:8000``): the
    same base with them is asked too, in what is left of the deadline (1 s at
    least), and the message says what to pass instead when it lists models
    (``answered 404; http://10.0.0.5:8000/v1/models lists 1 models: use
    --upstream http://10.0.0.5:8000/v1``), or what it answered.

    Returns:
        Per URL, in order: its listing URL (``redact_url``: no userinfo, no
        query) and its ids, or a message saying why it has none (no secret
        and none of the upstream's words, only its status).
    """
    started = time.monotonic()
    results = asyncio.run(_list_all(urls, timeout_s, transport))
    guesses = {
        url: guess
        for url, (_, ids) in zip(urls, results, strict=True)
        if isinstance(ids, str) and (guess := _likely_base(url, ids)) is not None
    }
    if not guesses:
        return results
    left_s = max(1.0, timeout_s - (time.monotonic() - started))
    tried = asyncio.run(_list_all(list(guesses.values()), left_s, transport))
    hints = {url: _hint(*answer) for url, answer in zip(guesses, tried, strict=True)}
    return [
        (listing, f"{ids}{hints[url]}" if url in hints else ids)
        for url, (listing, ids) in zip(urls, results, strict=True)
    ]


def _likely_base(url: str, why: str) -> str | None:
    """``url`` with the scheme (``http``) and the ``/v1`` it seems to lack, or
    ``None`` when nothing looks missing (or it is no URL at all)."""
    guess = url if "://" in url else f"http://{url}"
    try:
        parsed = httpx.URL(guess)
    except httpx.InvalidURL:
        return None
    missing = why == "answered 404" or guess != url
    if missing and not parsed.path.rstrip("/").endswith("/v1"):
        parsed = parsed.copy_with(path=parsed.path.rstrip("/") + "/v1")
    found = str(parsed)
    return found if found != url.rstrip("/") and parsed.host else None


def _hint(listing: str, ids: list[str] | str) -> str:
    """What a failure's message adds about the likely base (its listing URL,
    redacted as every URL discovery names): use it, or what it answered."""
    base = listing.removesuffix("/models")  # guess/models, redacted
    if isinstance(ids, list) and ids:
        return f"; {listing} lists {len(ids)} models: {_BASE_HINT}{base}"
    why = ids if isinstance(ids, str) else "lists no model"
    return f" (is the base {base}? {listing}: {why})"


async def _list_all(
    urls: Sequence[str], timeout_s: float, transport: httpx.AsyncBaseTransport | None
) -> list[tuple[str, list[str] | str]]:
    async with httpx.AsyncClient(
        timeout=timeout_s, transport=transport, trust_env=False, follow_redirects=False
    ) as client:
        tasks = [asyncio.ensure_future(_list(client, url)) for url in urls]
        await asyncio.wait(tasks, timeout=timeout_s)
        results: list[tuple[str, list[str] | str]] = []
        for url, task in zip(urls, tasks, strict=True):
            name = redact_url(url.rstrip("/") + "/models")
            if task.done():
                results.append((name, task.result()))
            else:
                task.cancel()
                results.append((name, f"no model list within {timeout_s:g} s"))
        await asyncio.gather(*tasks, return_exceptions=True)
    return results


async def _list(client: httpx.AsyncClient, url: str) -> list[str] | str:
    try:
        async with client.stream("GET", url.rstrip("/") + "/models") as answer:
            if answer.status_code != 200:
                return f"answered {answer.status_code}"
            body = bytearray()
            async for data in answer.aiter_bytes():
                body += data
                if len(body) > MODELS_MAX_BYTES:
                    return f"a model list over {MODELS_MAX_BYTES} bytes"
        return [str(model["id"]) for model in orjson.loads(body)["data"]]
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return f"no answer ({type(exc).__name__})"
    except (ValueError, KeyError, TypeError):  # not JSON (or too deep), no ids
        return "not an OpenAI model list"


def engines_from_file(path: Path, environ: Mapping[str, str]) -> list[UpstreamEngine]:
    """One engine per ``[[models]]`` entry of the TOML file at ``path``.

    Raises:
        ValueError: the file cannot be read or parsed, or an entry is invalid
            (the message names the file, the entry and the setting).
    """
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
    unknown = sorted(set(document) - {"models"})
    models = document.get("models")
    if unknown or not isinstance(models, list) or not models:
        raise ValueError(
            f"{path}: expected only [[models]] entries (one at least); "
            f"got keys {sorted(document)}"
        )
    engines = []
    for number, entry in enumerate(models, 1):
        try:
            engines.append(_engine(entry, environ))
        except ValueError as exc:
            raise ValueError(f"{path}: models entry {number}: {exc}") from exc
    return engines


def _engine(entry: Any, environ: Mapping[str, str]) -> UpstreamEngine:
    if not isinstance(entry, dict):
        raise ValueError(f"expected a table, got {entry!r}")
    known = {"id", "context_length", "upstreams", *_MODEL_KEYS}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise ValueError(f"unknown settings {unknown}; known: {sorted(known)}")
    model_id = entry.get("id")
    if not isinstance(model_id, str) or not model_id:
        raise ValueError(f"expected a non-empty string as id, got {model_id!r}")
    context_length = entry.get("context_length", 0)
    if type(context_length) is not int or context_length < 0:
        raise ValueError(f"expected context_length >= 0, got {context_length!r}")
    upstreams = entry.get("upstreams")
    if not isinstance(upstreams, list) or not upstreams:
        raise ValueError("expected one [[models.upstreams]] table at least")
    options: dict[str, Any] = {}
    for key, kind in _MODEL_KEYS.items():
        if key in entry:
            value = entry[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"expected a number as {key}, got {value!r}")
            options[key] = kind(value)
    return UpstreamEngine.from_config(
        _model_info(model_id, context_length), upstreams, environ, **options
    )


def _model_info(model_id: str, context_length: int) -> ModelInfo:
    return ModelInfo(
        model_id, context_length, created=int(time.time()), owned_by="upstream"
    )
