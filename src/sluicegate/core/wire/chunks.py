"""Pure builders for OpenAI chunk, usage and error payloads.

Every builder returns a fresh ``dict`` ready for ``dumps``; none does I/O. Field
names and order follow the OpenAI API reference: ``id``, ``object``, ``created``,
``model``, ``system_fingerprint`` (only when known), ``choices``, ``usage``.

Shapes of a streamed response (``ResponseHeader`` holds what every chunk of one
response shares):

- every choice in a chunk has ``index``, its content (``delta`` for chat, ``text``
  for completions), ``logprobs`` (``null`` unless asked for) and
  ``finish_reason`` (``null`` until the choice's last chunk);
- with ``include_usage`` every chunk carries ``"usage": null`` except the final
  usage chunk, which has ``"choices": []`` and the usage object; without it no
  chunk has a ``usage`` key. With ``continuous_usage`` every chunk carries the
  usage so far.

``dumps`` is the one JSON encoder of the core.

Spec: OpenAI API reference, "The chat completion object", "The chat completion
chunk object", "The completion object" and "Error codes".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from sluicegate.core.events import DeltaParts, FinishReason, ToolCallFragment, Usage
from sluicegate.core.logprobs import (
    LogprobToken,
    chat_logprobs,
    completion_logprobs,
)

__all__ = [
    "MAX_INT",
    "MIN_INT",
    "Endpoint",
    "ResponseHeader",
    "chat_chunk",
    "chat_delta",
    "completion_chunk",
    "dumps",
    "error_payload",
    "head_fields",
    "usage_chunk",
    "usage_dict",
]


class Endpoint(StrEnum):
    """Which API a response answers (the value is its chunks' or object's ``object``
    or ``type``): chat and text completions, the Responses API, Anthropic's
    Messages API. The last two are written by their own stream machines
    (``core/wire/contracts.py``)."""

    CHAT = "chat.completion.chunk"
    COMPLETION = "text_completion"
    RESPONSES = "response"
    MESSAGES = "message"


@dataclass(frozen=True, slots=True)
class ResponseHeader:
    """Fields identical on every chunk of one response.

    Attributes:
        id: the response id (``chatcmpl-...`` or ``cmpl-...``).
        created: Unix time in seconds when the response was created.
        model: the model name as the client asked for it.
        endpoint: chat or text completions.
        n: number of choices (>= 1).
        include_usage: ``stream_options.include_usage`` of the request.
        system_fingerprint: sent on every chunk when not ``None``.
        continuous_usage: every chunk carries the usage so far (vLLM's
            ``continuous_usage_stats``), the role chunks included.
        prompt_tokens: the prompt tokens of the response (tokens), for the usage
            of the role chunks when ``continuous_usage`` is set, and Messages'
            ``message_start``.
        cached_tokens: the part of ``prompt_tokens`` read from a cache, where
            known before the first token (tokens).
        echo: the request's fields an API's response object repeats (the
            Responses API's ``tools``, ``tool_choice``, ``parallel_tool_calls``,
            ...), in its wire names; ``None`` for the API's defaults. Not
            compared.
    """

    id: str
    created: int
    model: str
    endpoint: Endpoint
    n: int = 1
    include_usage: bool = False
    system_fingerprint: str | None = None
    continuous_usage: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    echo: Mapping[str, Any] | None = field(default=None, compare=False)


MIN_INT = -(2**63)
MAX_INT = 2**63 - 1
"""The integers ``dumps`` writes as they are (signed 64-bit: what every JSON
reader that parses integers into a machine word takes)."""


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON (no spaces, non-ASCII kept as UTF-8).

    Control characters (CR, LF, NUL, ...) are escaped, so the result never
    contains a line end; U+2028 and U+2029 are kept as UTF-8 (valid JSON, and not
    line ends in an event stream).

    An integer orjson cannot write (past 64 bits: an upstream's usage, say) does
    not fail the frame: when ``obj`` holds one, every integer of ``obj`` outside
    ``MIN_INT..MAX_INT`` is written as the nearest bound instead.

    Raises:
        TypeError: ``obj`` holds a value JSON cannot represent, or a ``str`` with
            a lone surrogate (``orjson.JSONEncodeError`` is a ``TypeError``).
    """
    try:
        return orjson.dumps(obj)
    except orjson.JSONEncodeError:
        clamped = _clamp_ints(obj)
        if clamped is obj:  # not an integer's fault
            raise
        return orjson.dumps(clamped)


def _clamp_ints(obj: Any) -> Any:
    """``obj`` with every ``int`` outside ``MIN_INT..MAX_INT`` clamped into it,
    in copies of the dicts and lists that hold one; ``obj`` itself if none."""
    if type(obj) is int:
        if MIN_INT <= obj <= MAX_INT:
            return obj
        return MAX_INT if obj > 0 else MIN_INT
    if isinstance(obj, dict):
        items = {key: _clamp_ints(value) for key, value in obj.items()}
        same = all(items[key] is value for key, value in obj.items())
        return obj if same else items
    if isinstance(obj, list | tuple):
        values = [_clamp_ints(value) for value in obj]
        return obj if all(a is b for a, b in zip(values, obj, strict=True)) else values
    return obj


def head_fields(header: ResponseHeader, object_: str) -> dict[str, Any]:
    """``{id, object: object_, created, model}`` and ``system_fingerprint`` when
    known: the fields every chunk and object of one response starts with."""
    head: dict[str, Any] = {
        "id": header.id,
        "object": object_,
        "created": header.created,
        "model": header.model,
    }
    if header.system_fingerprint is not None:
        head["system_fingerprint"] = header.system_fingerprint
    return head


def _chunk(
    header: ResponseHeader,
    object_: str,
    choice: dict[str, Any],
    usage: Usage | None = None,
) -> dict[str, Any]:
    chunk = head_fields(header, object_)
    chunk["choices"] = [choice]
    if usage is not None:
        chunk["usage"] = usage_dict(usage)
    elif header.include_usage:
        chunk["usage"] = None
    return chunk


def chat_chunk(
    header: ResponseHeader,
    index: int,
    delta: Mapping[str, Any],
    finish_reason: FinishReason | None = None,
    *,
    logprobs: Sequence[LogprobToken] | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """A ``chat.completion.chunk`` with one choice.

    Args:
        header: the response's shared fields (its ``endpoint`` is not checked:
            the ``object`` is always ``chat.completion.chunk``).
        index: the choice index (0 <= index < n).
        delta: ``{"role": "assistant"}``, ``{"content": text}`` or ``{}`` (on the
            finish chunk). Copied into the result.
        finish_reason: ``None`` until the choice's last chunk.
        logprobs: the tokens of ``delta``'s content, sent as ``{"content": [...]}``
            (see ``chat_logprobs``); ``None`` sends ``"logprobs": null``.
        usage: the usage so far (``continuous_usage``); ``None`` sends
            ``"usage": null`` when ``include_usage``, else no ``usage`` key.

    Spec: OpenAI API reference, "The chat completion chunk object".
    """
    return _chunk(
        header,
        Endpoint.CHAT.value,
        {
            "index": index,
            "delta": dict(delta),
            "logprobs": None if logprobs is None else chat_logprobs(logprobs),
            "finish_reason": finish_reason,
        },
        usage,
    )


def chat_delta(text: str, parts: DeltaParts | None = None) -> dict[str, Any]:
    """The ``delta`` of a chat chunk that carries ``text`` and ``parts``.

    Args:
        text: the content text; ``""`` sends no ``content`` key when ``parts``
            has something, and ``{"content": ""}`` when it has not.
        parts: reasoning text and tool-call fragments, or ``None``.

    Returns:
        ``{"content": text}`` for text only (the shape of every content chunk
        before parts existed). With parts, in this order and each only when
        non-empty: ``content``, ``reasoning_content`` (the reasoning text),
        ``tool_calls`` (one object per fragment: ``index``, then ``id`` and
        ``"type": "function"`` when the fragment has an id, then ``function``
        with ``name`` when it has one and ``arguments`` always).

    Spec: OpenAI API reference, "The chat completion chunk object",
    ``choices[].delta``; ``reasoning_content`` is the field name of
    OpenAI-compatible servers that stream reasoning (OpenAI's own API does not).
    """
    if not parts:
        return {"content": text}
    delta: dict[str, Any] = {}
    if text:
        delta["content"] = text
    if parts.reasoning:
        delta["reasoning_content"] = parts.reasoning
    if parts.tool_calls:
        delta["tool_calls"] = [_tool_call(f) for f in parts.tool_calls]
    return delta


def _tool_call(fragment: ToolCallFragment) -> dict[str, Any]:
    call: dict[str, Any] = {"index": fragment.index}
    if fragment.id is not None:
        call["id"] = fragment.id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if fragment.name is not None:
        function["name"] = fragment.name
    function["arguments"] = fragment.arguments
    call["function"] = function
    return call


def completion_chunk(
    header: ResponseHeader,
    index: int,
    text: str,
    finish_reason: FinishReason | None = None,
    *,
    logprobs: Sequence[LogprobToken] | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    """A streamed ``text_completion`` object with one choice.

    Args:
        header: the response's shared fields (``object`` is always
            ``text_completion``).
        index: the choice index (0 <= index < n).
        text: the new text (``""`` on the finish chunk).
        finish_reason: ``None`` until the choice's last chunk.
        logprobs: the tokens of ``text`` (see ``completion_logprobs``); ``None``
            sends ``"logprobs": null``.
        usage: as for ``chat_chunk``.

    Spec: OpenAI API reference, "Completions", "The completion object".
    """
    return _chunk(
        header,
        Endpoint.COMPLETION.value,
        {
            "index": index,
            "text": text,
            "logprobs": None if logprobs is None else completion_logprobs(logprobs),
            "finish_reason": finish_reason,
        },
        usage,
    )


def usage_dict(usage: Usage) -> dict[str, Any]:
    """``{"prompt_tokens", "completion_tokens", "total_tokens"}`` (tokens), and
    ``completion_tokens_details: {"reasoning_tokens"}`` when ``usage`` counts
    reasoning (a response with a reasoning channel, even when it reasoned 0),
    and ``prompt_tokens_details: {"cached_tokens"}`` when the engine read some
    of the prompt from its cache (left out otherwise, as vLLM leaves it out).

    Spec: OpenAI API reference, "The chat completion object", ``usage``.
    """
    counts: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.reasoning_tokens is not None:
        counts["completion_tokens_details"] = {
            "reasoning_tokens": usage.reasoning_tokens
        }
    if usage.cached_tokens:
        counts["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return counts


def usage_chunk(header: ResponseHeader, usage: Usage) -> dict[str, Any]:
    """The final chunk of an ``include_usage`` stream: ``choices: []`` and usage.

    Its ``object`` is the header's endpoint value. It is built whether or not
    ``header.include_usage`` is set; deciding to send it is the stream's job.

    Spec: OpenAI API reference, "Create chat completion", ``stream_options``.
    """
    chunk = head_fields(header, header.endpoint.value)
    chunk["choices"] = []
    chunk["usage"] = usage_dict(usage)
    return chunk


def error_payload(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``.

    Used for error bodies before streaming (4xx/5xx) and for the one in-band error
    event after the first byte.

    Spec: OpenAI API reference, "Error codes".
    """
    return {"error": {"message": message, "type": type, "param": param, "code": code}}
