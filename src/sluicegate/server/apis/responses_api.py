"""The Responses API in front of the chat path: its body in, a chat request out.

A ``POST /v1/responses`` body is validated by its own models (so a 400 names the
Responses API's parameter), then translated into a chat-completions request
that the chat planner checks and tokenizes as any other:

::

    instructions                          -> a system message first
    input: a string                       -> one user message
    input items                           -> messages (``responses_input.py``)
    max_output_tokens                     -> max_tokens
    tools [{type: function, name, ...}]   -> chat function tools
    tool_choice none|auto|required|{type: function, name}
    text.format text|json_object|json_schema -> response_format
    reasoning.effort                      -> reasoning_effort
    {type: reasoning} of the open         -> that turn's reasoning_content
        function-call cycle                  (others: left out)

    stream_options.include_obfuscation    -> stream_options.include_obfuscation
    stream_options.stream_interval        -> stream_options.stream_interval

A stored response (``store``, ``background``; see ``response_store.py``) is
asked of the chat path as a resumable stream (``stream_options.resumable``)
whatever the client asked, so that its events are kept in the log; the items
of a ``previous_response_id`` come first in its input. Images, files,
non-function tools and ``conversation`` are refused with a 400 naming them (not
served here). The answer is written by ``core/wire/responses.py``.

Spec: OpenAI API reference, "Responses", "Create a model response".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sluicegate.core.errors import RequestError
from sluicegate.server.apis.responses_input import chat_messages
from sluicegate.server.schemas.fields import MAX_STREAM_INTERVAL
from sluicegate.server.schemas.param_errors import (
    check_tool_choice,
    validated,
)
from sluicegate.server.schemas.translation import Translation, translate

__all__ = [
    "ResponsesRequest",
    "input_items",
    "parse_responses_request",
    "response_echo",
    "to_chat_request",
]

MAX_ITEMS = 1024
"""Most input items in one request (a bound on the work of one request)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionTool(_Model):
    """``{"type": "function", "name", "description", "parameters", "strict"}``."""

    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedFunction(_Model):
    """``{"type": "function", "name"}``: this function must be called."""

    type: Literal["function"]
    name: str = Field(min_length=1)


class TextFormat(_Model):
    """``text.format``: ``text``, ``json_object`` or ``json_schema``."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    name: str = "output"
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextOptions(_Model):
    """``text``: its ``format``."""

    format: TextFormat | None = None


class StreamOptions(_Model):
    """``stream_options``: ``include_obfuscation`` pads the stream's events;
    this server's ``stream_interval`` writes its content every N tokens."""

    include_obfuscation: bool | None = None
    stream_interval: int | None = Field(None, ge=1, le=MAX_STREAM_INTERVAL)


class ReasoningOptions(_Model):
    """``reasoning``: ``effort`` (``"none"``: thinking off, any other value
    on); ``summary`` is accepted and has no effect (no summaries are written:
    the reasoning item carries the model's own text)."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
    Field(max_length=16),
]
"""``metadata``: at most 16 pairs, keys of at most 64 characters, values of at
most 512, as OpenAI bounds it (every response object repeats it)."""


class ResponsesRequest(_Model):
    """A ``POST /v1/responses`` body.

    Spec: OpenAI API reference, "Create a model response".
    """

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool = True
    text: TextOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    store: bool | None = None
    background: bool = False
    previous_response_id: str | None = None
    metadata: Metadata | None = None
    user: str | None = None
    reasoning: ReasoningOptions | None = None


_NOT_SERVED = {
    "conversation": "conversations are not kept by this server; use"
    " previous_response_id",
}


def parse_responses_request(body: dict[str, Any]) -> ResponsesRequest:
    """Validate a Responses body.

    Raises:
        RequestError: 400 naming the parameter (``input[1].content[0].type``,
            ``tools[0].type``, ``store`` false with ``background``...).
    """
    for name, why in _NOT_SERVED.items():
        if body.get(name) not in (None, False):
            raise RequestError(
                f"The parameter '{name}' is not supported ({why})",
                param=name,
                code="unsupported_parameter",
            )
    items = body.get("input")
    if isinstance(items, list) and len(items) > MAX_ITEMS:
        raise RequestError(
            f"Invalid 'input': at most {MAX_ITEMS} items, got {len(items)}",
            param="input",
            code="array_above_max_length",
        )
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise RequestError(
                    f"Only function tools are supported; got type {kind!r}",
                    param=f"tools[{i}].type",
                    code="unsupported_parameter",
                )
    check_tool_choice(body.get("tool_choice"))
    request = validated(ResponsesRequest, body)
    if request.background and request.store is False:
        raise RequestError(
            "A background response must be stored: set 'store' to true",
            param="store",
            code="invalid_value",
        )
    return request


_ECHOED = (
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "previous_response_id",
    "metadata",
)


def response_echo(request: ResponsesRequest) -> dict[str, Any]:
    """The fields of ``request`` its response object repeats, in the object's
    shapes: ``tools``, ``tool_choice`` (``"auto"`` when unset),
    ``parallel_tool_calls``, ``text`` when set, and those of ``instructions``,
    ``max_output_tokens``, ``temperature``, ``top_p``, ``previous_response_id``
    and ``metadata`` the request set.

    Spec: OpenAI API reference, "Responses", "The response object".
    """
    choice = request.tool_choice
    echo: dict[str, Any] = {
        "parallel_tool_calls": request.parallel_tool_calls,
        "tool_choice": (
            choice.model_dump() if isinstance(choice, NamedFunction) else choice
        )
        or "auto",
        "tools": [tool.model_dump(by_alias=True) for tool in request.tools],
    }
    if request.text is not None and request.text.format is not None:
        fmt = request.text.format
        shown = fmt.model_dump(by_alias=True, exclude_none=True)
        echo["text"] = {
            "format": shown if fmt.type == "json_schema" else {"type": fmt.type}
        }
    for name in _ECHOED:
        value = getattr(request, name)
        if value is not None:
            echo[name] = value
    return echo


def input_items(request: ResponsesRequest) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message)."""
    if isinstance(request.input, str):
        return [{"type": "message", "role": "user", "content": request.input}]
    return list(request.input)


def to_chat_request(
    request: ResponsesRequest,
    stored: bool = False,
    history: Sequence[dict[str, Any]] = (),
) -> Translation:
    """The chat-completions request that asks for what ``request`` asks, and
    the Responses name of each of its messages (``instructions``, ``input[2]``).

    Args:
        stored: ask for a resumable stream, whatever ``request.stream`` says
            (and a stream that is not stored is never resumable).
        history: the items of the previous response (its input, then its
            output), put before ``request``'s own input.

    Raises:
        RequestError: 400 for an input item or part this server cannot take,
            naming it, or from the chat checks (naming the item a message
            came from).
    """
    items = [
        (item, f"previous_response_id.items[{i}]") for i, item in enumerate(history)
    ]
    if isinstance(request.input, str):
        items.append(({"role": "user", "content": request.input}, "input"))
    else:
        items += [(item, f"input[{i}]") for i, item in enumerate(request.input)]
    messages, origins = chat_messages(items)
    if request.instructions:
        messages.insert(0, {"role": "system", "content": request.instructions})
        origins.insert(0, "instructions")
    stream = request.stream or stored
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "stream": stream,
        "parallel_tool_calls": request.parallel_tool_calls,
    }
    if stream:
        # Logged exactly when stored, whatever the resumable-streams default.
        options: dict[str, Any] = {"include_usage": True, "resumable": stored}
        asked = request.stream_options
        padded = asked.include_obfuscation if asked is not None else None
        if padded is not None:
            options["include_obfuscation"] = padded
        if asked is not None and asked.stream_interval is not None:
            options["stream_interval"] = asked.stream_interval
        body["stream_options"] = options
    for name in ("temperature", "top_p"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.max_output_tokens is not None:
        body["max_tokens"] = request.max_output_tokens
    if request.tools:
        body["tools"] = [_chat_tool(tool) for tool in request.tools]
    choice = request.tool_choice
    if isinstance(choice, NamedFunction):
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        body["tool_choice"] = choice
    if request.text is not None and request.text.format is not None:
        body["response_format"] = _response_format(request.text.format)
    if request.reasoning is not None and request.reasoning.effort is not None:
        body["reasoning_effort"] = request.reasoning.effort
    return translate(body, origins)


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    for name in ("description", "parameters", "strict"):
        value = getattr(tool, name)
        if value is not None:
            function[name] = value
    return {"type": "function", "function": function}


def _response_format(fmt: TextFormat) -> dict[str, Any]:
    if fmt.type != "json_schema":
        return {"type": fmt.type}
    schema: dict[str, Any] = {"name": fmt.name, "schema": fmt.json_schema or {}}
    if fmt.strict is not None:
        schema["strict"] = fmt.strict
    return {"type": "json_schema", "json_schema": schema}
