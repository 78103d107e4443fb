"""What the upstream engine sends: one upstream's settings, a request's body.

Pure helpers of ``engines/upstream/engine.py``: the settings of one upstream
(``UpstreamConfig``, read from a config file's dict by ``upstream_from_dict``;
its ``redactor`` and its ``name``, the URL without secrets) and the JSON body
of a streamed request (``request_body``). What an upstream's refusal means is
``engines/upstream/refusals.py``'s.

Spec: OpenAI API reference, "Create chat completion" and "Create completion".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from sluicegate.core.errors import bounded_repr
from sluicegate.core.redact import Redactor, redact_url, url_secrets
from sluicegate.core.upstream.limits import READER_LIMITS, ReaderLimits
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import GenerateRequest

__all__ = [
    "UpstreamConfig",
    "UpstreamTimeouts",
    "request_body",
    "upstream_from_dict",
]


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
        count_s: for its token counter's answer to a ``count_tokens`` request
            (``count.py``); a counter that does not answer in time is a 504.
    """

    connect_s: float | None = 5.0
    first_token_s: float | None = 120.0
    idle_s: float | None = 60.0
    total_s: float | None = None
    count_s: float | None = 10.0


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
            sluicegate know it; OpenAI's own API may refuse it). ``None``:
            as the upstream's kind says at start-up (``context.py``:
            on for vLLM and sluicegate), else off.
        logprobs: it reports logprobs when asked (vLLM, SGLang, llama-server,
            TGI and Ollama do); ``False`` (configured, or learnt from an answer
            that came without them): a request for logprobs is refused.
        health_path: what the active health check gets (relative to ``url``);
            ``""``: no active check.
        limits: the bounds its streams are read within (``ReaderLimits``).
        redactor: replaces its secrets (the key, the URL's userinfo and query
            values) in any text (``core/redact.py``); made from the others.
    """

    url: str
    model: str | None = None
    api_key: str | None = field(default=None, repr=False)
    max_streams: int = 1024
    timeouts: UpstreamTimeouts = UpstreamTimeouts()
    continuous_usage: bool | None = None
    logprobs: bool = True
    health_path: str = "/models"
    limits: ReaderLimits = READER_LIMITS
    redactor: Redactor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        secrets = [*url_secrets(self.url)]
        if self.api_key is not None:
            secrets.append(self.api_key)
        object.__setattr__(self, "redactor", Redactor(secrets))

    @property
    def name(self) -> str:
        """The upstream as logs and metrics name it: its URL without userinfo,
        query or fragment (``redact_url``)."""
        return redact_url(self.url)


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
    "count_timeout_s": "count_s",
}
_KEYS = frozenset(
    {"url", "model", "api_key_env", "max_streams", "continuous_usage", "health_path"}
    | {"logprobs"}
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
            ``continuous_usage``, ``logprobs``, ``health_path``, the time limits
            ``connect_timeout_s``, ``first_token_timeout_s``,
            ``idle_timeout_s``, ``total_timeout_s``, ``count_timeout_s``
            (seconds, or ``null``),
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
        shown = redact_url(url) if isinstance(url, str) else bounded_repr(url)
        raise ValueError(f"expected an http(s) URL as the upstream's url, got {shown}")
    if urlsplit(url).query or "#" in url:
        raise ValueError(
            f"expected an upstream url without a query or fragment (the request "
            f"paths are appended to it), got {redact_url(url)}"
        )
    model = spec.get("model")
    if model is not None and not isinstance(model, str):
        raise ValueError(f"expected a string as the upstream's model, got {model!r}")
    api_key = None
    env_name = spec.get("api_key_env")
    if env_name is not None:
        if not isinstance(env_name, str) or env_name not in environ:
            raise ValueError(
                f"the upstream {redact_url(url)}'s api_key_env "
                f"{bounded_repr(env_name)} is not set"
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
        continuous_usage=(
            None
            if spec.get("continuous_usage") is None
            else bool(spec["continuous_usage"])
        ),
        logprobs=bool(spec.get("logprobs", True)),
        health_path=str(spec.get("health_path", "/models")),
        limits=ReaderLimits(**bounds),
    )


def request_body(
    request: GenerateRequest, model: str, *, continuous_usage: bool | None
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
