"""What the upstream engine sends, and what an upstream's refusal means.

Pure helpers of ``engines/upstream.py``: the settings of one upstream
(``UpstreamConfig``, read from a config file's dict by ``upstream_from_dict``),
the JSON body of a streamed request (``request_body``), and the meaning of an
upstream's answer other than 200 (``refusal_of``), or of a 200 whose stream
fails before any content (``failure_before_content``).

Spec: OpenAI API reference, "Create chat completion", "Create completion" and
"Error codes"; RFC 9110, section 10.2.3 (``Retry-After``).
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sluicegate.core.chunks import Endpoint
from sluicegate.core.errors import EngineRefused, bounded_repr
from sluicegate.core.reader_limits import READER_LIMITS, ReaderLimits
from sluicegate.engines.base import GenerateRequest
from sluicegate.engines.pool import Outcome

__all__ = [
    "UpstreamConfig",
    "UpstreamTimeouts",
    "failure_before_content",
    "refusal_of",
    "request_body",
    "retry_after_s",
    "upstream_from_dict",
]

REFUSAL_BODY_MAX_BYTES = 65536
"""Most bytes of a refused request's body that are read for its message."""


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Time limits of one upstream's streams, each on its own (seconds; ``None``:
    no limit).

    Attributes:
        connect_s: to open the TCP connection (also each health check's limit).
        first_token_s: from ``generate`` to the first text or finish, queueing
            and the upstream's prefill included.
        idle_s: the longest silence between two events once the first token
            came (keep-alive comments do not count).
        total_s: from ``generate`` to the stream's end.
    """

    connect_s: float | None = 5.0
    first_token_s: float | None = 120.0
    idle_s: float | None = 60.0
    total_s: float | None = None


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """One OpenAI-compatible upstream of a pool.

    Attributes:
        url: its API base, e.g. ``http://10.0.0.5:8000/v1`` (the engine posts to
            ``<url>/chat/completions`` and ``<url>/completions``).
        model: the model name the upstream knows; ``None``: the served id.
        api_key: sent as ``Authorization: Bearer <key>``; ``None``: no header.
        max_streams: streams in flight on it at most (>= 1).
        timeouts: its time limits.
        continuous_usage: ask for usage on every chunk
            (``stream_options.continuous_usage_stats``; vLLM, SGLang and
            sluicegate know it; OpenAI's own API may refuse it, so off by
            default).
        health_path: what the active health check gets (relative to ``url``);
            ``""``: no active check.
        limits: the bounds its streams are read within (``ReaderLimits``).
    """

    url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_streams: int = 1024
    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    continuous_usage: bool = False
    health_path: str = "/models"
    limits: ReaderLimits = READER_LIMITS


_LIMIT_KEYS = (
    "max_line_bytes",
    "max_event_bytes",
    "max_deltas_per_chunk",
    "max_tool_calls",
    "max_response_bytes",
)
_TIMEOUT_KEYS = {
    "connect_timeout_s": "connect_s",
    "first_token_timeout_s": "first_token_s",
    "idle_timeout_s": "idle_s",
    "total_timeout_s": "total_s",
}
_KEYS = frozenset(
    {"url", "model", "api_key_env", "max_streams", "continuous_usage", "health_path"}
    | _TIMEOUT_KEYS.keys()
    | set(_LIMIT_KEYS)
)


def upstream_from_dict(
    spec: Mapping[str, Any], environ: Mapping[str, str]
) -> UpstreamConfig:
    """An ``UpstreamConfig`` from one upstream's entry in a config file.

    Args:
        spec: ``url`` (required), ``model``, ``api_key_env`` (the name of the
            environment variable holding the key), ``max_streams``,
            ``continuous_usage``, ``health_path``, and the time limits
            ``connect_timeout_s``, ``first_token_timeout_s``,
            ``idle_timeout_s``, ``total_timeout_s`` (seconds, or ``null``),
            and the reader's bounds ``max_line_bytes``, ``max_event_bytes``,
            ``max_deltas_per_chunk``, ``max_tool_calls``,
            ``max_response_bytes`` (integers >= 1; ``ReaderLimits``).
        environ: the environment to read ``api_key_env`` from.

    Raises:
        ValueError: an unknown key, a missing ``url``, a value of the wrong
            type, or ``api_key_env`` naming a variable that is not set.
    """
    unknown = sorted(set(spec) - _KEYS)
    if unknown:
        raise ValueError(f"unknown upstream settings {unknown}; known: {sorted(_KEYS)}")
    url = spec.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ValueError(f"expected an http(s) URL as the upstream's url, got {url!r}")
    model = spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"expected a string as the upstream's model, got {model!r}")
    api_key = None
    env_name = spec.get("api_key_env")
    if env_name is not None:
        if not isinstance(env_name, str) or env_name not in environ:
            raise ValueError(
                f"the upstream {url}'s api_key_env {env_name!r} is not set"
            )
        api_key = environ[env_name]
    max_streams = spec.get("max_streams", 1024)
    if type(max_streams) is not int or max_streams < 1:
        raise ValueError(f"expected max_streams >= 1, got {max_streams!r}")
    limits: dict[str, float | None] = {}
    for key, name in _TIMEOUT_KEYS.items():
        if key in spec:
            value = spec[key]
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or value <= 0
            ):
                raise ValueError(f"expected {key} > 0 or null, got {value!r}")
            limits[name] = None if value is None else float(value)
    bounds = {key: spec[key] for key in _LIMIT_KEYS if key in spec}
    for key, value in bounds.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"expected {key} >= 1 (an integer), got {value!r}")
    return UpstreamConfig(
        url=url.rstrip("/"),
        model=model,
        api_key=api_key,
        max_streams=max_streams,
        timeouts=UpstreamTimeouts(**limits),
        continuous_usage=bool(spec.get("continuous_usage", False)),
        health_path=str(spec.get("health_path", "/models")),
        limits=ReaderLimits(**bounds),
    )


def request_body(
    request: GenerateRequest, model: str, *, continuous_usage: bool
) -> bytes:
    """The JSON body that asks the upstream for ``request``'s one stream.

    ``stream`` with usage included and ``n: 1`` always; ``max_tokens`` when
    the client (or the server's default) set one; the choice's ``seed``; the
    prompt's ``extra`` fields (the sampling fields the client set, as it set
    them: ``top_k``, ``min_p``, ``repetition_penalty`` and ``ignore_eos`` are
    vLLM's and SGLang's names, understood by llama.cpp's server too)
    underneath, so they can never turn streaming off.

    Raises:
        ValueError: the request has no ``text_prompt``.
    """
    prompt = request.text_prompt
    if prompt is None:
        raise ValueError("expected a request with a text_prompt for an upstream")
    p = request.params
    body: dict[str, Any] = dict(prompt.extra)
    body["model"] = model
    if prompt.endpoint is Endpoint.CHAT:
        body["messages"] = [dict(m) for m in prompt.messages]
    else:
        text = prompt.prompt
        body["prompt"] = text if isinstance(text, str) else list(text)
    options: dict[str, Any] = {"include_usage": True}
    if continuous_usage:
        options["continuous_usage_stats"] = True
    body.update(stream=True, stream_options=options, n=1)
    if prompt.max_tokens is not None:
        body["max_tokens"] = prompt.max_tokens
    if p.seed is not None:
        body["seed"] = p.seed
    if prompt.stop:
        body["stop"] = list(prompt.stop)
    return orjson.dumps(body)


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds (>= 0): delay-seconds or an HTTP date; ``None``
    when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds) or math.isinf(seconds):
        return None
    return max(0.0, seconds)


def refusal_of(
    status: int, body: bytes, retry_after: str | None, upstream: str
) -> tuple[EngineRefused, Outcome, bool]:
    """What an upstream's non-200 answer before its stream means.

    Returns:
        The refusal to give the client if no other upstream takes the request;
        the outcome for the upstream's health; whether to try another one
        (429 and 5xx: yes; other 4xx: no, another upstream would say the same).
        The client gets the upstream's status and message for 429, 503 and
        4xx, 422 as 400; 401, 403, 404 and 405 (the gateway's own setup is
        wrong) and other 5xx as 502, 504 as 504.
    """
    message, kind, code, param = _error_fields(body)
    wait = retry_after_s(retry_after)
    if status in (401, 403, 404, 405) or (status >= 500 and status not in (503, 504)):
        text = f"the upstream {upstream} answered {status}: {message}"
        failed = status >= 500
        outcome = Outcome.FAILURE if failed else Outcome.REFUSED
        return EngineRefused(text, 502, retry_after_s=wait), outcome, failed
    if status in (429, 503, 504):
        refusal = EngineRefused(message, status, retry_after_s=wait, code=code)
        return refusal, Outcome.FAILURE if status == 504 else Outcome.REFUSED, True
    refusal = EngineRefused(
        message,
        400 if status == 422 or not 400 <= status <= 499 else status,
        error_type=kind,
        code=code,
        param=param,
    )
    return refusal, Outcome.REFUSED, False


def failure_before_content(
    message: str, code: str | None, kind: str | None, upstream: str
) -> tuple[EngineRefused, Outcome, bool]:
    """What an upstream's 200 means when its stream fails before any content.

    The stream broke, ended (with or without ``[DONE]``) or sent an in-band
    error before its first text, tool call or finish: nothing reached the
    client, so it is answered as the status the upstream would have given.

    Args:
        message: what went wrong (the upstream's in-band message, or ours).
        code: the in-band error's code; an HTTP status there (vLLM sends one)
            is read as that status.
        kind: the in-band error's type, or ``None``.
        upstream: the upstream's URL, for the message.

    Returns:
        As ``refusal_of`` for an in-band error whose code is a status (400-599);
        otherwise a 502 to try on another upstream, counted as its failure.
    """
    if code is not None and code.isdigit() and 400 <= int(code) <= 599:
        body = orjson.dumps({"error": {"message": message, "type": kind, "code": code}})
        return refusal_of(int(code), body, None, upstream)
    text = f"the upstream {upstream} failed before any content: {message}"
    return EngineRefused(text, 502, error_type=kind), Outcome.FAILURE, True


def _error_fields(body: bytes) -> tuple[str, str | None, str | None, str | None]:
    """An error body's message, type, code and param (OpenAI, vLLM, TGI, FastAPI)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return (text[:1000] or "no message"), None, None, None
    error = obj.get("error", obj) if isinstance(obj, dict) else obj
    if isinstance(error, str):
        return error, None, None, None
    if not isinstance(error, dict):
        return bounded_repr(obj), None, None, None
    message = error.get("message", error.get("detail"))
    if not isinstance(message, str) or not message:
        message = bounded_repr(error)
    fields = [error.get(k) for k in ("type", "code", "param")]
    kind, code, param = (None if v is None else str(v) for v in fields)
    return message, kind or None, code, param
