"""A chat message as a request body carries it: role, text content, tool calls.

``content`` may be a string or a list of ``{"type": "text"}`` parts (joined with
``"\\n"``); images, audio and files are refused. Assistant messages may carry
``tool_calls`` (their ``content`` then may be ``null``), ``tool`` messages need a
``tool_call_id``, and ``null`` content reads as ``""``.

Spec: OpenAI API reference, "Create chat completion" (``messages``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluicegate.core.errors import bounded_repr
from sluicegate.server.schemas.tools import MessageToolCall

__all__ = ["ChatMessage"]


class ChatMessage(BaseModel):
    """One message; ``content`` is normalised to a string (``null`` reads ``""``)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who wrote it; ``developer`` is OpenAI's newer name for ``system``;
    ``tool`` holds a call's result."""
    content: str
    """The text (a list of text parts arrives joined with ``"\\n"``)."""
    tool_calls: list[MessageToolCall] = Field(default_factory=list)
    """The calls an assistant message made (history)."""
    tool_call_id: str | None = None
    """The call a ``tool`` message answers."""
    name: str | None = None
    """The participant's name (OpenAI's ``name``); not rendered."""
    reasoning_content: str | None = None
    """An assistant message's earlier reasoning, as a chat answer gave it
    (``message.reasoning_content``); reaches the chat template as the message's
    ``reasoning_content`` (Qwen3's template renders it for the turns after the
    last user message, and drops it for earlier ones)."""

    @model_validator(mode="before")
    @classmethod
    def _content_rules(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        role, calls = value.get("role"), value.get("tool_calls")
        if calls is not None and role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if role == "tool" and not isinstance(value.get("tool_call_id"), str):
            raise ValueError("a tool message needs a string tool_call_id")
        if value.get("content") is None and role == "assistant" and calls:
            value = {**value, "content": ""}
        # ``null`` means "not given": a missing content is then named as such.
        return {k: v for k, v in value.items() if v is not None}

    @field_validator("content", mode="before")
    @classmethod
    def _join_text_parts(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        texts = []
        for part in value:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else part
                raise ValueError(
                    f"only text parts are supported; got {bounded_repr(kind)}"
                )
            if not isinstance(part.get("text"), str):
                raise ValueError("a text part needs a string 'text'")
            texts.append(part["text"])
        return "\n".join(texts)
