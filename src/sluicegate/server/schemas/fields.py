"""The fields that chat and completions requests share, with their limits.

``RequestFields`` is the pydantic base of both request models (``chat.py``):
sampling, stop strings, streaming and vLLM's extensions, each with its range. Its
validators refuse empty stop strings, stop strings over ``MAX_STOP_CHARS``, and
``logit_bias`` keys that are not short ASCII decimal token ids or values outside
``[-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]``.

Spec: OpenAI API reference, "Create chat completion" and "Create completion".
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sluicegate.core.errors import bounded_repr

__all__ = [
    "MAX_CADENCE_MS",
    "MAX_LOGIT_BIAS",
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "MAX_TOKEN_ID_DIGITS",
    "RequestFields",
    "StreamOptions",
]

MAX_STOP_STRINGS = 16
"""Most stop strings one request may give (OpenAI allows 4)."""

MAX_STOP_CHARS = 1000
"""Most characters of one stop string. OpenAI publishes no length limit; Amazon
Bedrock documents 1 to 1,000 characters per stop sequence, which real stops (end
markers, ``"\\n\\n"``, role prefixes: tens of characters) fit with room to spare.
The matcher costs time and memory linear in the stops' length (``StopPattern``),
but it is compiled on the event loop: this keeps one request's stops under
``MAX_STOP_STRINGS * MAX_STOP_CHARS`` (16,000) characters, compiled once per
request in 10-20 ms on this project's 2-core machine."""

MAX_LOGIT_BIAS = 100.0
"""``logit_bias`` values lie in ``[-MAX_LOGIT_BIAS, MAX_LOGIT_BIAS]``."""

MAX_TOKEN_ID_DIGITS = 10
"""Most digits of a ``logit_bias`` key: token ids are 32-bit (llama.cpp's
``llama_token``), and a longer key is refused before ``int()`` converts it."""

_TOKEN_ID = re.compile(rf"[0-9]{{1,{MAX_TOKEN_ID_DIGITS}}}", re.ASCII)


MAX_CADENCE_MS = 1000.0
"""The longest ``stream_options.cadence_ms`` a request may ask for (ms)."""


MAX_STREAM_INTERVAL = 1000
"""The most tokens per write ``stream_options.stream_interval`` (and
``--stream-interval``) may ask for."""


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage``, vLLM's ``continuous_usage_stats``,
    OpenAI's ``include_obfuscation``, and this server's ``resumable``,
    ``cadence_ms`` and ``stream_interval``."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    include_usage: bool = False
    """Send a last chunk with ``choices: []`` and the ``usage`` of the response."""
    continuous_usage_stats: bool = False
    """Also put the usage so far on every chunk (vLLM extension)."""
    resumable: bool | None = None
    """Keep the stream's events so a dropped client can resume it (``None``: the
    server's default; see docs/resumable-streams.md)."""
    include_obfuscation: bool | None = None
    """Pad every event of the stream (``core/wire/padding.py``); ``None``: the
    server's default (on unless ``--no-obfuscation``)."""
    cadence_ms: float | None = Field(None, ge=0, le=MAX_CADENCE_MS)
    """Send events on a clock of this period (ms; 0: off); ``None``: the
    server's default (``--cadence-ms``)."""
    stream_interval: int | None = Field(None, ge=1, le=MAX_STREAM_INTERVAL)
    """Write the stream's content every this many tokens (the first at once,
    the end at once), as vLLM's ``--stream-interval``; ``None``: the server's
    default (``--stream-interval``)."""


class RequestFields(BaseModel):
    """What both request bodies hold; ``chat.py`` adds each endpoint's own."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    model: str | None = None
    n: int = Field(1, ge=1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    """Chat's newer name for ``max_tokens``, which it wins over. Not in OpenAI's
    legacy completions API; taken there as chat takes it, so a client that
    sends it everywhere is not ignored.

    .. versionchanged:: 0.2.0
       Honoured by completions; it was silently ignored."""
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's sampling extensions.
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    continuous_usage_stats: bool = False

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: Any) -> Any:
        if value is None:
            return []
        value = [value] if isinstance(value, str) else value
        if isinstance(value, list) and "" in value:
            raise ValueError("stop strings must not be empty")
        if isinstance(value, list):
            for i, stop in enumerate(value):
                if isinstance(stop, str) and len(stop) > MAX_STOP_CHARS:
                    raise ValueError(
                        f"stop[{i}] has {len(stop)} characters; at most "
                        f"{MAX_STOP_CHARS} are allowed"
                    )
        return value

    @field_validator("logit_bias")
    @classmethod
    def _bias_in_range(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key, bias in (value or {}).items():
            if _TOKEN_ID.fullmatch(key) is None:
                raise ValueError(
                    f"keys must be token ids (decimal strings); {bounded_repr(key)} "
                    f"is not one (ASCII digits, at most {MAX_TOKEN_ID_DIGITS})"
                )
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(
                    f"the bias of token {key} is {bias!r} but must lie in "
                    f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]"
                )
        return value

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk carries the usage so far (vLLM extension)."""
        options = self.stream_options
        return self.continuous_usage_stats or (
            options is not None and options.continuous_usage_stats
        )

    @property
    def include_usage(self) -> bool:
        """Whether the stream ends with a usage chunk (implied by continuous usage)."""
        options = self.stream_options
        return self.continuous_usage or (options is not None and options.include_usage)

    @property
    def resumable(self) -> bool | None:
        """``stream_options.resumable``: ``None`` when the request did not say."""
        options = self.stream_options
        return None if options is None else options.resumable

    @property
    def include_obfuscation(self) -> bool | None:
        """``stream_options.include_obfuscation``, ``None`` when not given."""
        options = self.stream_options
        return None if options is None else options.include_obfuscation

    @property
    def cadence_s(self) -> float | None:
        """``stream_options.cadence_ms`` in seconds, ``None`` when not given."""
        options = self.stream_options
        if options is None or options.cadence_ms is None:
            return None
        return options.cadence_ms / 1000.0

    @property
    def stream_interval(self) -> int | None:
        """``stream_options.stream_interval``, ``None`` when not given."""
        options = self.stream_options
        return None if options is None else options.stream_interval

    @property
    def requested_max_tokens(self) -> int | None:
        """``max_completion_tokens``, else ``max_tokens`` (tokens), or ``None``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        """The name of the parameter that set ``requested_max_tokens``."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return "max_tokens"

    @property
    def top_logprobs_k(self) -> int | None:
        """Alternatives per token to report, or ``None`` for no logprobs."""
        return None
