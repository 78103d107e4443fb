"""Request-body models of tool calls and structured outputs (OpenAI's shapes).

``ToolDefinition`` (``tools[]``), ``NamedToolChoice`` (``tool_choice`` naming a
function), ``MessageToolCall`` (an assistant message's ``tool_calls[]`` in the
history) and ``ResponseFormat`` are strict pydantic models that
``server/schemas/chat.py`` builds its chat request from; ``check_tools`` checks what
spans fields. Only shapes are checked here: what a JSON Schema may hold is
checked where it is compiled into a constraint.

Spec: OpenAI API reference, "Create chat completion" (``tools``,
``tool_choice``, ``parallel_tool_calls``, ``response_format``, messages).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sluicegate.core.errors import RequestError, bounded_repr

__all__ = [
    "MAX_FUNCTION_NAME_CHARS",
    "MAX_TOOLS",
    "FunctionCall",
    "FunctionDefinition",
    "JsonSchemaFormat",
    "MessageToolCall",
    "NamedToolChoice",
    "ResponseFormat",
    "ToolChoice",
    "ToolDefinition",
    "check_tools",
]

MAX_TOOLS = 128
"""Most functions one request may offer in ``tools`` (OpenAI's limit too)."""

MAX_FUNCTION_NAME_CHARS = 64
"""Longest function name (OpenAI's limit)."""

_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


def _function_name(value: str) -> str:
    """A name OpenAI accepts: 1 to 64 of ``[A-Za-z0-9_-]``."""
    if _FUNCTION_NAME.fullmatch(value) is None:
        raise ValueError(
            "a function name is 1 to 64 characters from a-z, A-Z, 0-9, '_' and '-'"
        )
    return value


class FunctionDefinition(BaseModel):
    """``tools[].function``: a function the model may call."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    name: str
    """``[A-Za-z0-9_-]``, 1 to 64 characters."""
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON Schema object of the arguments; ``None``: no parameters."""
    strict: bool | None = None
    """Whether the arguments must follow ``parameters`` exactly."""

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _function_name(value)


class ToolDefinition(BaseModel):
    """One of ``tools``: ``{"type": "function", "function": {...}}``."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    type: Literal["function"]
    function: FunctionDefinition


class _FunctionName(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    name: str


class NamedToolChoice(BaseModel):
    """``tool_choice`` naming one function: the model must call it."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    type: Literal["function"]
    function: _FunctionName


class FunctionCall(BaseModel):
    """The function of a call in an assistant message of the history."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    name: str
    arguments: str
    """The arguments as JSON text, as the model wrote them."""


class MessageToolCall(BaseModel):
    """One of an assistant message's ``tool_calls`` (history)."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: a named JSON Schema for the answer."""

    model_config = ConfigDict(
        extra="ignore", strict=True, frozen=True, populate_by_name=True
    )

    name: str
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    """The JSON Schema (``schema`` on the wire)."""
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``response_format``: plain text, any JSON object, or JSON of a schema."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a 'json_schema' object")
        return self


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
"""``tool_choice``: a mode, or the one function to call."""


def check_tools(tools: Sequence[ToolDefinition], choice: ToolChoice | None) -> None:
    """Refuse tools with the same name, a ``tool_choice`` that calls without
    ``tools``, and a named one that names none of them.

    Raises:
        RequestError: 400 naming ``tools[i].function.name`` or ``tool_choice``.
    """
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.function.name in names:
            raise RequestError(
                f"Invalid value for 'tools[{i}].function.name': "
                f"{tool.function.name!r} names two tools",
                param=f"tools[{i}].function.name",
                code="invalid_value",
            )
        names.add(tool.function.name)
    if choice is None or choice == "none":
        return
    if not names:
        shown = choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
        raise RequestError(
            f"Invalid value for 'tool_choice': {bounded_repr(shown)} is only "
            "allowed when 'tools' are given",
            param="tool_choice",
            code="invalid_value",
        )
    if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
        raise RequestError(
            f"Invalid value for 'tool_choice': no tool is named "
            f"{bounded_repr(choice.function.name, MAX_FUNCTION_NAME_CHARS)}",
            param="tool_choice",
            code="invalid_value",
        )
