"""Anthropic's Messages API objects: the non-streamed message, usage, stop
reasons, thinking signatures and error bodies.

``MessagesStream`` (``messages.py``) streams the same objects as events;
this module holds what both the stream and the whole body say.

Spec: Anthropic API reference, "Messages", "Errors" and "Extended thinking".
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import orjson

from sluicegate.core.events import FinishReason, Usage
from sluicegate.core.wire.chunks import ResponseHeader

__all__ = [
    "ERROR_TYPES",
    "ThinkingDigest",
    "message_body",
    "message_error_body",
    "stop_reason",
    "thinking_signature",
    "usage_object",
]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""HTTP status -> Anthropic's error ``type``; any other status is ``api_error``
(a 4xx not listed: ``invalid_request_error``). Anthropic's "Errors" page lists
504 as ``timeout_error`` (the request timed out while processing); 503 is this
server's busy answer, which Anthropic sends as 529."""

_STOP_REASONS = {
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.CONTENT_FILTER: "refusal",
}


def usage_object(usage: Usage) -> dict[str, int]:
    """Anthropic's ``usage``: ``{input_tokens, cache_creation_input_tokens,
    cache_read_input_tokens, output_tokens}`` (tokens).

    ``input_tokens`` counts the prompt tokens not read from a cache, as
    Anthropic counts them (the prompt is the sum of the three input fields);
    ``cache_read_input_tokens`` is ``usage.cached_tokens``;
    ``cache_creation_input_tokens`` is 0 (no request writes a cache
    breakpoint here).

    Spec: Anthropic API reference, "Messages", ``usage``.
    """
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


def stop_reason(reason: FinishReason | None, stop_sequence: str | None) -> str | None:
    """Anthropic's ``stop_reason`` for a finish: ``end_turn``, ``stop_sequence``
    (a stop string matched), ``max_tokens``, ``tool_use`` or ``refusal`` (an
    upstream's content filter); ``None`` for none."""
    if reason is None:
        return None
    if reason is FinishReason.STOP:
        return "end_turn" if stop_sequence is None else "stop_sequence"
    return _STOP_REASONS[reason]


def thinking_signature(text: str) -> str:
    """The ``signature`` of a thinking block whose text is ``text``: the
    base64 of its UTF-8 SHA-256 digest, as the streamed and the non-streamed
    answers give it (``ThinkingDigest`` computes it piece by piece)."""
    return ThinkingDigest(text).signature


class ThinkingDigest:
    """A thinking block's text so far, digested as it streams (``add`` each
    piece; ``signature`` at the end)."""

    __slots__ = ("_digest",)

    def __init__(self, text: str = "") -> None:
        self._digest = hashlib.sha256(text.encode())

    def add(self, text: str) -> None:
        """``text`` follows what was added so far."""
        self._digest.update(text.encode())

    @property
    def signature(self) -> str:
        """The base64 of the SHA-256 digest of the text so far."""
        return base64.b64encode(self._digest.digest()).decode()


def message_body(header: ResponseHeader, whole: Any) -> dict[str, Any]:
    """The non-streamed ``message`` object of a finished response.

    Args:
        header: id and model.
        whole: a ``wire.Whole``: text, finish reason, usage, calls, stop string,
            reasoning.

    Returns:
        ``{id, type: "message", role: "assistant", model, content: [thinking
        block {thinking, signature} (when there is reasoning), text block
        (when there is text), tool_use blocks with ``input`` the parsed
        arguments], stop_reason, stop_sequence, usage: {input_tokens,
        output_tokens}}``.

    Spec: Anthropic API reference, "Messages", the response.
    """
    content: list[dict[str, Any]] = []
    if whole.reasoning:
        signature = thinking_signature(whole.reasoning)
        thinking = {"type": "thinking", "thinking": whole.reasoning}
        content.append({**thinking, "signature": signature})
    if whole.text:
        content.append({"type": "text", "text": whole.text})
    for call in whole.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id or "",
                "name": call.name or "",
                "input": _input(call.arguments),
            }
        )
    return {
        "id": header.id,
        "type": "message",
        "role": "assistant",
        "model": header.model,
        "content": content,
        "stop_reason": stop_reason(whole.finish_reason, whole.stop_sequence),
        "stop_sequence": whole.stop_sequence,
        "usage": usage_object(whole.usage),
    }


def _input(arguments: str) -> Any:
    """A call's arguments as the ``input`` object (``{}`` for none)."""
    if not arguments:
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def message_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}`` for HTTP ``status``
    (``ERROR_TYPES``; ``api_error`` for a 5xx not listed)."""
    default = "invalid_request_error" if 400 <= status < 500 else "api_error"
    kind = ERROR_TYPES.get(status, default)
    return {"type": "error", "error": {"type": kind, "message": message}}
