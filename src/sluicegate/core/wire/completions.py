"""The non-streamed ``chat.completion`` and ``text_completion`` objects.

Pure builders, as ``chunks.py``'s: each returns a fresh ``dict`` for ``dumps``.
The fields every response starts with and the usage object are ``chunks.py``'s.

Spec: OpenAI API reference, "The chat completion object" and "The completion
object".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sluicegate.core.events import FinishReason, ToolCallFragment, Usage
from sluicegate.core.logprobs import LogprobToken, chat_logprobs, completion_logprobs
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    head_fields,
    usage_dict,
)

__all__ = ["chat_completion", "text_completion"]


def chat_completion(
    header: ResponseHeader,
    choices: Sequence[tuple[str, FinishReason | None]],
    usage: Usage,
    logprobs: Sequence[Sequence[LogprobToken] | None] | None = None,
    tool_calls: Sequence[Sequence[ToolCallFragment]] | None = None,
    reasoning: Sequence[str] | None = None,
) -> dict[str, Any]:
    """A non-streamed ``chat.completion`` response.

    Args:
        header: the response's shared fields (``endpoint``, ``n`` and
            ``include_usage`` are not used).
        choices: ``(content, finish_reason)`` of each choice, in index order.
        usage: token counts of the whole response.
        logprobs: each choice's tokens (``None`` for a choice, or for all, sends
            ``logprobs: null``).
        tool_calls: each choice's calls, one whole fragment per call (``id``,
            ``name`` and all of its ``arguments``), in index order; ``None``
            or ``()`` for none.
        reasoning: each choice's whole reasoning text, in index order, for a
            response with a reasoning channel; ``None`` for none.

    Returns:
        ``choices`` as ``[{index, message: {role: "assistant", content},
        logprobs, finish_reason}]``, then ``usage``. A choice with calls has
        ``message.tool_calls`` (``[{id, type: "function", function: {name,
        arguments}}]``) and ``content: null`` when it has no content text.
        With ``reasoning``, every message has ``reasoning_content`` (``null``
        for a choice that did not reason), as the streamed deltas name it.

    Spec: OpenAI API reference, "The chat completion object".
    """
    response = _whole_response(
        head_fields(header, "chat.completion"),
        choices,
        usage,
        logprobs,
        lambda content: {"message": {"role": "assistant", "content": content}},
        chat_logprobs,
    )
    for choice, thought in zip(response["choices"], reasoning or (), strict=False):
        choice["message"]["reasoning_content"] = thought or None
    for choice, calls in zip(response["choices"], tool_calls or (), strict=False):
        if calls:
            message = choice["message"]
            message["content"] = message["content"] or None
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
    return response


def text_completion(
    header: ResponseHeader,
    choices: Sequence[tuple[str, FinishReason | None]],
    usage: Usage,
    logprobs: Sequence[Sequence[LogprobToken] | None] | None = None,
) -> dict[str, Any]:
    """A non-streamed ``text_completion`` response.

    Args:
        header: the response's shared fields (``endpoint``, ``n`` and
            ``include_usage`` are not used).
        choices: ``(text, finish_reason)`` of each choice, in index order.
        usage: token counts of the whole response.
        logprobs: as for ``chat_completion``.

    Returns:
        ``choices`` as ``[{index, text, logprobs, finish_reason}]``, then
        ``usage``.

    Spec: OpenAI API reference, "The completion object".
    """
    return _whole_response(
        head_fields(header, Endpoint.COMPLETION.value),
        choices,
        usage,
        logprobs,
        lambda text: {"text": text},
        completion_logprobs,
    )


def _whole_response(
    response: dict[str, Any],
    choices: Sequence[tuple[str, FinishReason | None]],
    usage: Usage,
    logprobs: Sequence[Sequence[LogprobToken] | None] | None,
    text_fields: Callable[[str], dict[str, Any]],
    format_logprobs: Callable[[Sequence[LogprobToken]], dict[str, Any]],
) -> dict[str, Any]:
    """``response`` (its head) with ``choices`` and ``usage``: what the two
    non-streamed objects share; ``text_fields`` and ``format_logprobs`` are
    what differs (``message`` or ``text``, and the logprobs' shape)."""
    tokens = logprobs or [None] * len(choices)
    response["choices"] = [
        {
            "index": index,
            **text_fields(text),
            "logprobs": None if lp is None else format_logprobs(lp),
            "finish_reason": reason,
        }
        for index, ((text, reason), lp) in enumerate(zip(choices, tokens, strict=True))
    ]
    response["usage"] = usage_dict(usage)
    return response
