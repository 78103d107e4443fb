"""The bounds an ``UpstreamReader`` holds an upstream's stream to, and its usage check.

An upstream's body is untrusted input, bounded like a client's request body:
``ReaderLimits`` says how much of it one reader may hold or work through at
once (a line, an event, a chunk's deltas, a choice's tool calls, the whole
body). A stream past any of them ends with an ``UpstreamError`` whose code is
``PROTOCOL_ERROR_CODE``; the reader never holds more than the bounds between
two ``feed`` calls.

``usage_problem`` says why an upstream's ``usage`` numbers cannot be true, or
``None``: the reader then reports them; otherwise it reports
``UpstreamUsageRejected`` once and no usage after it, and the gateway counts
the tokens itself (an estimate).

Spec: docs/security.md, "Upstream reader limits" and "Usage numbers and the
ledger".
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from sluicegate.core.errors import bounded_repr

__all__ = [
    "MAX_TOOL_NAME_CHARS",
    "MAX_USAGE_TOKENS",
    "NO_USAGE_BOUNDS",
    "READER_LIMITS",
    "ReaderLimits",
    "UsageBounds",
    "cached_tokens",
    "reported_reasoning_tokens",
    "usage_problem",
]

MAX_TOOL_NAME_CHARS = 64
"""The longest tool name an upstream may call (characters): the API's own bound
on a function's name, so no offered tool has a longer one."""

MAX_USAGE_TOKENS = (1 << 63) - 1
"""The largest token count a usage may carry: a signed 64-bit integer, what the
ledger's columns (SQLite, PostgreSQL ``BIGINT``) and the JSON encoder hold."""


@dataclass(frozen=True, slots=True)
class ReaderLimits:
    """How much of one upstream stream a reader takes (each >= 1).

    Attributes:
        max_line_bytes: the longest SSE line (bytes, its line end not
            counted). Threat: a line that never ends grows memory without
            bound.
        max_event_bytes: the most data of one SSE event (bytes): one chunk's
            JSON. Threat: one huge chunk (a 50 MB delta) held, parsed and
            copied into every frame built from it.
        max_deltas_per_chunk: choices plus tool-call entries of one chunk.
            Threat: one chunk whose work (100,000 tool-call deltas) holds the
            event loop, stalling every other stream.
        max_tool_calls: tool calls one choice may begin. Threat: a stream of
            calls that grows the reader's state without bound.
        max_response_bytes: the whole body (bytes). Threat: a stream that never
            ends, read and billed for ever.

    Raises:
        ValueError: a bound that is not an integer >= 1.
    """

    max_line_bytes: int = 1 << 20
    max_event_bytes: int = 1 << 20
    max_deltas_per_chunk: int = 1024
    max_tool_calls: int = 128
    max_response_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if type(value) is not int or value < 1:
                raise ValueError(f"expected {field.name} >= 1, got {value!r}")


READER_LIMITS = ReaderLimits()
"""The default bounds."""


@dataclass(frozen=True, slots=True)
class UsageBounds:
    """What a request's usage can be at most (tokens; ``None``: not known).

    Attributes:
        max_completion_tokens: the ``max_tokens`` the upstream was asked for;
            the reader also cuts a choice past that many output chunks.
        context_tokens: the model's context window (prompt and completion).
        max_prompt_tokens: the most tokens the prompt sent can be (its UTF-8
            bytes and the chat template's own tokens: every other token covers
            at least one byte), which bounds it when the window is unknown.
    """

    max_completion_tokens: int | None = None
    context_tokens: int | None = None
    max_prompt_tokens: int | None = None


NO_USAGE_BOUNDS = UsageBounds()
"""Bounds of a request whose ``max_tokens`` and context are not known."""


def usage_problem(
    usage: dict[str, Any], bounds: UsageBounds, body_bytes: int
) -> tuple[str | None, int, int]:
    """Check an upstream's ``usage`` object; its prompt and completion tokens.

    A count that is missing is 0. The usage cannot be true when a count is not
    a JSON integer (a float, a string, ``true``), is negative or past
    ``MAX_USAGE_TOKENS``, when the completion passes ``max_completion_tokens``,
    prompt and completion together pass ``context_tokens``, the prompt passes
    ``max_prompt_tokens``, or when the
    completion tokens that were streamed (those past
    ``completion_tokens_details.reasoning_tokens``, which some upstreams never
    stream) outnumber the bytes of the body read so far: every streamed token
    came inside those bytes.

    Args:
        usage: the chunk's ``usage`` object, as parsed.
        bounds: the request's bounds.
        body_bytes: bytes of the body read so far, this chunk's included.

    Returns:
        Why the usage cannot be true (``None``: it can), and its prompt and
        completion tokens (0 and 0 when it cannot).
    """
    prompt = usage.get("prompt_tokens", 0)
    completion = usage.get("completion_tokens", 0)
    for name, value in (("prompt_tokens", prompt), ("completion_tokens", completion)):
        if type(value) is not int or not 0 <= value <= MAX_USAGE_TOKENS:
            return f"{name} is not a token count: {_shown(value)}", 0, 0
    limit = bounds.max_completion_tokens
    if limit is not None and completion > limit:
        why = (
            f"completion_tokens {completion} is past the max_tokens asked for, {limit}"
        )
        return why, 0, 0
    window = bounds.context_tokens
    if window is not None and prompt + completion > window:
        why = (
            f"prompt_tokens {prompt} and completion_tokens {completion} are past "
            f"the model's context window, {window}"
        )
        return why, 0, 0
    most = bounds.max_prompt_tokens
    if most is not None and prompt > most:
        why = f"prompt_tokens {prompt} is more than the prompt sent can hold, {most}"
        return why, 0, 0
    if completion - _reasoning_tokens(usage, completion) > body_bytes:
        why = (
            f"completion_tokens {completion} is more than the {body_bytes} bytes "
            "the upstream streamed could carry"
        )
        return why, 0, 0
    return None, prompt, completion


def cached_tokens(usage: dict[str, Any], prompt: int) -> int:
    """``prompt_tokens_details.cached_tokens`` (vLLM, SGLang, llama-server,
    OpenAI) when it is a count within ``prompt``; else 0 (none, or not true).

    Spec: OpenAI API reference, "The chat completion object",
    ``usage.prompt_tokens_details``.
    """
    details = usage.get("prompt_tokens_details")
    if type(details) is not dict:
        return 0
    cached = details.get("cached_tokens")
    if type(cached) is not int or not 0 <= cached <= prompt:
        return 0
    return cached


def _reasoning_tokens(usage: dict[str, Any], completion: int) -> int:
    """``completion_tokens_details.reasoning_tokens`` when it is a count within
    ``completion``; else 0."""
    reasoning = reported_reasoning_tokens(usage, completion)
    return 0 if reasoning is None else reasoning


def reported_reasoning_tokens(usage: dict[str, Any], completion: int) -> int | None:
    """An upstream usage's ``completion_tokens_details.reasoning_tokens`` when
    it is a count within ``completion`` (tokens); ``None`` when it is missing
    or cannot be true."""
    details = usage.get("completion_tokens_details")
    if type(details) is not dict:
        return None
    reasoning = details.get("reasoning_tokens")
    if type(reasoning) is not int or not 0 <= reasoning <= completion:
        return None
    return reasoning


def _shown(value: object) -> str:
    """A count as the message shows it: an integer past 64 bits by its size."""
    if type(value) is int and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    return bounded_repr(value, 40)
