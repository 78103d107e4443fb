"""Anthropic's Messages request body: its models and the checks Anthropic's API makes.

``parse_messages_request`` validates a ``POST /v1/messages`` (or
``count_tokens``) body and refuses what Anthropic's API refuses with a 400
naming the parameter, before the body is translated into a chat request
(``server/apis/messages_api.py``):

- a missing field of a content block names the field once
  (``messages[0].content[0].text``): a block's type is a union member here, and
  its tag (the block's class name, ``TextBlock``) is a label ``param_name``
  leaves out. Anthropic's API writes the block type into the path
  (``messages.0.content.0.text.text``); this server says it in words instead;
- image, document and search-result blocks (this server serves text models);
- a message with no content (``""`` or ``[]``), but the final assistant one;
- an empty text block (``{"type": "text", "text": ""}``) anywhere: in a
  message (the final assistant one too), in a ``tool_result``'s content, in
  ``system``. Anthropic refuses it with "messages: text content blocks must be
  non-empty" (``system:`` for the system prompt); only a message's or the
  system prompt's string content may be empty;
- a block in a role that cannot send it: ``thinking``, ``redacted_thinking``
  and ``tool_use`` come only from the assistant, ``tool_result`` only from the
  user;
- ``thinking`` enabled without a ``budget_tokens`` below ``max_tokens``, and
  thinking (``enabled`` or ``adaptive``) with a ``tool_choice`` that forces a
  call (``any``, ``tool``): Anthropic allows thinking with ``auto`` and
  ``none`` only.

Spec: Anthropic API reference, "Messages", "Errors"; Anthropic docs, "Building
with extended thinking" (tool choice with thinking).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
)

from sluicegate.core.errors import RequestError
from sluicegate.server.schemas.fields import MAX_STOP_STRINGS
from sluicegate.server.schemas.param_errors import (
    validated,
)

__all__ = [
    "MAX_BLOCKS",
    "MIN_THINKING_BUDGET",
    "Block",
    "Message",
    "MessagesRequest",
    "RedactedThinkingBlock",
    "TextBlock",
    "ThinkingBlock",
    "Tool",
    "ToolChoice",
    "ToolResultBlock",
    "ToolUseBlock",
    "parse_messages_request",
]

MIN_THINKING_BUDGET = 1024
"""The least ``thinking.budget_tokens`` Anthropic's API takes (tokens)."""

MAX_BLOCKS = 1024
"""Most content blocks in one message (a bound on the work of one request)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class TextBlock(_Model):
    """``{"type": "text", "text"}``."""

    type: Literal["text"]
    text: str


class ToolUseBlock(_Model):
    """An assistant's call: ``{"type": "tool_use", "id", "name", "input"}``."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(_Model):
    """A call's result: ``{"type": "tool_result", "tool_use_id", "content"}``."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Model):
    """Earlier reasoning: ``{"type": "thinking", "thinking", "signature"}``."""

    type: Literal["thinking"]
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Model):
    """Earlier reasoning a provider encrypted: ``{"type": "redacted_thinking",
    "data"}``."""

    type: Literal["redacted_thinking"]
    data: str = ""


_BLOCKS: dict[str, type[_Model]] = {
    "text": TextBlock,
    "tool_use": ToolUseBlock,
    "tool_result": ToolResultBlock,
    "thinking": ThinkingBlock,
    "redacted_thinking": RedactedThinkingBlock,
}
_SENDER = {
    "thinking": "assistant",
    "redacted_thinking": "assistant",
    "tool_use": "assistant",
    "tool_result": "user",
}
"""The one role that may send a block of each type (any for ``text``)."""
_REFUSED_BLOCKS = frozenset({"image", "document", "search_result"})


def _block_tag(block: Any) -> str | None:
    # A block's union tag is its class's name: a label param_name leaves out of
    # the parameter path (a tag "text" would read as a field: text.text).
    kind = block.get("type") if isinstance(block, dict) else getattr(block, "type", 0)
    model = _BLOCKS.get(kind) if isinstance(kind, str) else None
    return None if model is None else model.__name__


Block = Annotated[
    Annotated[TextBlock, Tag("TextBlock")]
    | Annotated[ToolUseBlock, Tag("ToolUseBlock")]
    | Annotated[ToolResultBlock, Tag("ToolResultBlock")]
    | Annotated[ThinkingBlock, Tag("ThinkingBlock")]
    | Annotated[RedactedThinkingBlock, Tag("RedactedThinkingBlock")],
    Discriminator(
        _block_tag,
        custom_error_type="invalid_block_type",
        custom_error_message="a content block's type must be one of "
        + ", ".join(map(repr, _BLOCKS)),
    ),
]
"""One content block, chosen by its ``type``."""


class Thinking(_Model):
    """``thinking``: ``{"type": "enabled", "budget_tokens"}``,
    ``{"type": "adaptive"}`` (thinking on, no budget) or ``{"type":
    "disabled"}``."""

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=MIN_THINKING_BUDGET)


class Message(_Model):
    """One turn: ``role`` and a string or content blocks."""

    role: Literal["user", "assistant"]
    content: Annotated[list[Block], Field(max_length=MAX_BLOCKS)] | str


class Tool(_Model):
    """``{"name", "description", "input_schema"}``."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=dict)


class ToolChoice(_Model):
    """``{"type": "auto"|"any"|"tool"|"none", "name", "disable_parallel_tool_use"}``."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormat(_Model):
    """``{"type": "json_schema", "schema"}``: the answer is JSON matching it."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Model):
    """``output_config``: its ``format`` (structured output); ``effort`` is
    accepted and has no effect on these models."""

    format: OutputFormat | None = None


class MessagesRequest(_Model):
    """A ``POST /v1/messages`` (or ``count_tokens``) body.

    ``max_tokens`` is required to create a message, not to count its tokens.

    Spec: Anthropic API reference, "Messages".
    """

    model: str
    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=1)
    tools: list[Tool] = Field(default_factory=list)
    tool_choice: ToolChoice | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    thinking: Thinking | None = None


def parse_messages_request(
    body: dict[str, Any], *, counting: bool = False
) -> MessagesRequest:
    """Validate a Messages body (the checks of the module docstring).

    Args:
        body: the decoded JSON object.
        counting: for ``count_tokens``: ``max_tokens`` may be left out.

    Raises:
        RequestError: 400 naming the parameter (``messages[0].content[1].type``),
            e.g. a missing ``max_tokens``, an image block, an empty message or
            thinking with a forced ``tool_choice``.
    """
    _refuse_blocks(body.get("messages"))
    request = validated(MessagesRequest, body)
    if request.max_tokens is None and not counting:
        raise RequestError(
            "Missing required parameter: 'max_tokens'", param="max_tokens"
        )
    _check_turns(request.messages)
    if isinstance(request.system, list):
        _check_texts(request.system, "system")
    _check_thinking(request)
    return request


def _check_texts(blocks: Sequence[object], at: str) -> None:
    """No empty text block among ``blocks`` (at ``at``), nor in a
    ``tool_result``'s content among them."""
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock) and not block.text:
            raise RequestError(
                f"{at}[{j}]: text content blocks must be non-empty",
                param=f"{at}[{j}].text",
            )
        if isinstance(block, ToolResultBlock) and isinstance(block.content, list):
            _check_texts(block.content, f"{at}[{j}].content")


def _check_turns(messages: list[Message]) -> None:
    """No empty message but the final assistant one (a prefill), no empty text
    block, and each block in a role that can send it, as Anthropic's API
    requires."""
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if not message.content and not (i == last and message.role == "assistant"):
            raise RequestError(
                f"messages[{i}]: all messages must have non-empty content except"
                " for the optional final assistant message",
                param=f"messages[{i}].content",
            )
        if isinstance(message.content, str):
            continue
        _check_texts(message.content, f"messages[{i}].content")
        for j, block in enumerate(message.content):
            sender = _SENDER.get(block.type, message.role)  # text: either
            if sender == message.role:
                continue
            raise RequestError(
                f"messages[{i}].content[{j}]: {block.type!r} blocks may only be in"
                f" {sender} messages; this message's role is {message.role!r}",
                param=f"messages[{i}].content[{j}].type",
            )


def _check_thinking(request: MessagesRequest) -> None:
    """``budget_tokens`` is required when thinking is enabled, and below
    ``max_tokens``; thinking takes ``tool_choice`` ``auto`` or ``none`` only."""
    thinking = request.thinking
    if thinking is None or thinking.type == "disabled":
        return
    choice = request.tool_choice
    if choice is not None and choice.type in ("any", "tool"):
        raise RequestError(
            "Thinking may not be enabled when tool_choice forces tool use: with"
            f" thinking {thinking.type!r}, tool_choice must be 'auto' or 'none';"
            f" got {choice.type!r}",
            param="tool_choice",
        )
    if thinking.type != "enabled":
        return
    budget = thinking.budget_tokens
    if budget is None:
        raise RequestError(
            "thinking.budget_tokens is required when thinking is enabled",
            param="thinking.budget_tokens",
        )
    if request.max_tokens is not None and budget >= request.max_tokens:
        raise RequestError(
            f"thinking.budget_tokens must be less than max_tokens; got "
            f"{budget} and max_tokens={request.max_tokens}",
            param="thinking.budget_tokens",
        )


def _refuse_blocks(messages: object) -> None:
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        _refuse_in(content, f"messages[{i}].content")


def _refuse_in(blocks: list[Any], at: str, outer: bool = True) -> None:
    """Refuse an unsupported block of ``blocks``, or of a ``tool_result``'s
    content among them (where Anthropic allows images too), naming it; one
    level deep only (a tool result holds no tool result)."""
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind in _REFUSED_BLOCKS:
            raise RequestError(
                f"{at}[{j}]: content blocks of type {kind!r} are not supported"
                " (this server serves text models)",
                param=f"{at}[{j}].type",
                code="unsupported_content",
            )
        inner = block.get("content") if kind == "tool_result" and outer else None
        if isinstance(inner, list):
            _refuse_in(inner, f"{at}[{j}].content", outer=False)
