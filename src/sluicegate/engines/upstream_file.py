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
    http_client = "aiohttp"            # or "httpx" (engines/upstream_http.py)

    [[models.upstreams]]
    url = "http://10.0.0.5:8000/v1"    # an OpenAI-compatible API base (required)
    model = "meta-llama/Llama-3.1-8B-Instruct"   # its name there (default: id)
    api_key_env = "VLLM_API_KEY"       # the variable holding its key
    max_streams = 64                   # streams in flight on it at most
    continuous_usage = true            # ask for usage on every chunk
    connect_timeout_s = 5
    first_token_timeout_s = 120
    idle_timeout_s = 60
    total_timeout_s = 600              # or leave out: no total limit
    max_line_bytes = 1048576           # the reader's bounds (docs/security.md,
    max_event_bytes = 1048576          # "Upstream reader limits"): an SSE line,
    max_deltas_per_chunk = 1024        # an event's data, a chunk's choices and
    max_tool_calls = 128               # tool-call entries, a choice's calls,
    max_response_bytes = 268435456     # the whole body

Spec: TOML v1.0.0; the upstream settings are ``upstream_from_dict``'s.
"""

from __future__ import annotations

import json
import time
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from sluicegate.engines.base import ModelInfo
from sluicegate.engines.upstream import UpstreamEngine
from sluicegate.engines.upstream_http import HOP_CLIENTS

__all__ = ["engine_from_urls", "engines_from_file", "served_model"]

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


def served_model(
    urls: Sequence[str],
    timeout_s: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> str:
    """The id of the one model the pool ``urls`` serves: ``GET {url}/models``
    of the first URL that answers it (OpenAI's "List models").

    Args:
        urls: API bases, e.g. ``http://10.0.0.5:8000/v1`` (>= 1), tried in order.
        timeout_s: the limit of each request (seconds).
        transport: an httpx transport to use instead of the network (tests).

    Raises:
        ValueError: no URL answered 200 with a model list, or the list does not
            hold exactly one model (the message names them, or why each URL
            failed, and says to pass ``--upstream-model``).
    """
    failures = []
    with httpx.Client(
        timeout=timeout_s, transport=transport, trust_env=False
    ) as client:
        for url in urls:
            listing = url.rstrip("/") + "/models"
            try:
                answer = client.get(listing)
                answer.raise_for_status()
                ids = [str(model["id"]) for model in answer.json()["data"]]
            except (httpx.HTTPError, json.JSONDecodeError) as exc:
                failures.append(f"{listing}: {exc}")
                continue
            except (KeyError, TypeError):
                failures.append(f"{listing}: not an OpenAI model list")
                continue
            if len(ids) == 1:
                return ids[0]
            listed = ", ".join(map(repr, ids)) if ids else "none"
            raise ValueError(
                f"{listing} lists {len(ids)} models ({listed}): pass "
                "--upstream-model NAME to say which one to serve"
            )
    raise ValueError(
        "could not ask the upstreams which model they serve ("
        + "; ".join(failures)
        + "): pass --upstream-model NAME"
    )


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
    known = {"id", "context_length", "upstreams", "http_client", *_MODEL_KEYS}
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
    if "http_client" in entry:
        client = entry["http_client"]
        if client not in HOP_CLIENTS:
            raise ValueError(
                f"expected http_client in {list(HOP_CLIENTS)}, got {client!r}"
            )
        options["http_client"] = client
    return UpstreamEngine.from_config(
        _model_info(model_id, context_length), upstreams, environ, **options
    )


def _model_info(model_id: str, context_length: int) -> ModelInfo:
    return ModelInfo(
        model_id, context_length, created=int(time.time()), owned_by="upstream"
    )
