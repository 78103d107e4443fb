"""A chat request's tools: which calls it allows, and how the prompt shows them.

``resolve_tools`` reads ``tools``, ``tool_choice`` and ``parallel_tool_calls``
into a ``ToolSetup`` (``None`` when no call may be made), whose ``decoding`` is
what each choice's tool-call parser needs. ``template_messages`` turns the
conversation into the messages a chat template renders:

- for a template that renders tools itself (a GGUF's Jinja template that reads
  ``tools``): the messages in the Hugging Face shape, assistant ``tool_calls``
  and ``tool`` messages as they are (``template_tools`` gives the ``tools``);
- for any other (the built-in Gemma template included): plain ``system``,
  ``user`` and ``assistant`` messages in the format of ``docs/tools.md``: the
  tools and how to call them at the end of the system message (one is added
  when there is none), past calls as ``<tool_call>`` blocks in their assistant
  turn, and each run of ``tool`` messages as one user turn of
  ``<tool_response>`` elements.

Every value written into the prompt is JSON-encoded (names, ids, schemas, and
arguments that are not JSON), so a client's text cannot close a tag it did not
open; control-token text in it is escaped as in any message content.

Spec: docs/tools.md; OpenAI API reference, "Create chat completion" (``tools``,
``tool_choice``, ``parallel_tool_calls``, assistant and tool messages); Hugging
Face "Chat templates", "Tool use".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from sluicegate.core.decoding.toolcalls import CLOSE_TAG, OPEN_TAG
from sluicegate.core.decoding.tooldecoder import ToolCallOptions
from sluicegate.core.errors import RequestError
from sluicegate.server.schemas.chat import ChatCompletionRequest, ChatMessage
from sluicegate.server.schemas.tools import (
    MessageToolCall,
    NamedToolChoice,
    ToolDefinition,
)

__all__ = [
    "ToolSetup",
    "call_block",
    "resolve_tools",
    "template_messages",
    "template_tools",
    "tools_prompt",
]

ToolMode = Literal["auto", "required", "named"]


@dataclass(frozen=True, slots=True)
class ToolSetup:
    """The calls a chat request allows.

    Attributes:
        tools: the functions offered, in request order.
        mode: ``auto`` (text or calls), ``required`` (at least one call) or
            ``named`` (one call, of ``function``).
        function: the function ``tool_choice`` names, for ``named``.
        parallel: ``parallel_tool_calls``: several calls per answer.
    """

    tools: tuple[ToolDefinition, ...]
    mode: ToolMode = "auto"
    function: str | None = None
    parallel: bool = True

    @property
    def names(self) -> tuple[str, ...]:
        """The functions a call may name (only ``function`` when ``named``)."""
        if self.function is not None:
            return (self.function,)
        return tuple(tool.function.name for tool in self.tools)

    @property
    def decoding(self) -> ToolCallOptions:
        """What each choice's tool-call parser needs."""
        single = not self.parallel or self.mode == "named"
        return ToolCallOptions(
            self.names, 1 if single else None, calls_only=self.mode != "auto"
        )


def resolve_tools(request: ChatCompletionRequest) -> ToolSetup | None:
    """The calls ``request`` allows, or ``None`` (no ``tools``, or ``none``).

    ``tool_choice`` left out means ``auto`` with tools, as OpenAI reads it; the
    request was validated already (a named function is one of ``tools``).
    """
    choice = request.tool_choice
    if not request.tools or choice == "none":
        return None
    tools = tuple(request.tools)
    parallel = request.parallel_tool_calls
    if isinstance(choice, NamedToolChoice):
        return ToolSetup(tools, "named", choice.function.name, parallel)
    return ToolSetup(
        tools, "required" if choice == "required" else "auto", None, parallel
    )


def tools_prompt(setup: ToolSetup) -> str:
    """The text that tells the model its tools and how to call them (it ends
    the system message). The exact text is documented in docs/tools.md."""
    lines = [
        "# Tools",
        "",
        "You can call these functions, each given as JSON with its name, what "
        "it does and the JSON Schema of its arguments:",
    ]
    lines += [_json(_function_line(tool)) for tool in setup.tools]
    lines += [
        "",
        "To call a function, write a block like this, with the arguments as a "
        "JSON object that follows the function's schema:",
        f'{OPEN_TAG}{{"name": "<function name>", "arguments": {{<arguments>}}}}'
        f"{CLOSE_TAG}",
    ]
    if setup.mode == "named":
        lines.append(
            f"Answer with one call of {_json(setup.function)} and nothing else."
        )
    elif setup.mode == "required":
        lines.append("Answer with calls only: at least one block and nothing else.")
    else:
        lines.append(
            "Call a function only when it helps; otherwise answer in plain text."
        )
    if setup.mode != "named":
        lines.append(
            "To make several calls, write one block per call, one after another."
            if setup.parallel
            else "Make at most one call per answer."
        )
    lines.append(
        'Each result comes back as <tool_response name="<function name>" '
        'id="<call id>"><result></tool_response>.'
    )
    return "\n".join(lines)


def call_block(name: str, arguments: str) -> str:
    """One call as the model writes it: ``<tool_call>{"name": ..., "arguments":
    ...}</tool_call>``; ``arguments`` kept as it is when it is JSON, else
    written as a JSON string."""
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        arguments = _json(arguments)
    return f'{OPEN_TAG}{{"name": {_json(name)}, "arguments": {arguments}}}{CLOSE_TAG}'


def template_messages(
    messages: Sequence[ChatMessage],
    setup: ToolSetup | None,
    *,
    native: bool,
) -> tuple[list[dict[str, Any]], list[int]]:
    """The messages a chat template renders, as plain dicts.

    Args:
        messages: the validated conversation.
        setup: the calls allowed, or ``None`` (the tools are not shown).
        native: the template renders ``tools`` and tool messages itself.

    Returns:
        The dicts, and for each the index in ``messages`` of the message it
        comes from (to name it in an error). ``native``: one dict per message
        (``role``, ``content``, and ``tool_calls``, ``tool_call_id``,
        ``name`` or ``reasoning_content`` where given). Otherwise only
        ``system``, ``user`` and ``assistant`` messages, in the block format of
        docs/tools.md (with ``reasoning_content`` where given).
        ``developer`` reads ``system`` in both.

    Raises:
        RequestError: 400 when a tool's schema cannot be written as JSON (nested
            too deep).
    """
    if native:
        return [_native(m) for m in messages], list(range(len(messages)))
    names = {c.id: c.function.name for m in messages for c in m.tool_calls}
    out: list[dict[str, Any]] = []
    origins: list[int] = []
    results = False  # the last dict is a user turn of tool results
    for i, message in enumerate(messages):
        role = "system" if message.role == "developer" else message.role
        if role == "tool":
            response = _tool_response(message, names)
            if results:
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
                origins.append(i)
            results = True
            continue
        results = False
        content = message.content
        if message.tool_calls:
            blocks = "\n".join(_history_block(c) for c in message.tool_calls)
            content = f"{content}\n{blocks}" if content else blocks
        turn: dict[str, Any] = {"role": role, "content": content}
        if message.reasoning_content:
            turn["reasoning_content"] = message.reasoning_content
        out.append(turn)
        origins.append(i)
    if setup is not None:
        tools = tools_prompt(setup)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{tools}"
        else:
            out.insert(0, {"role": "system", "content": tools})
            origins.insert(0, 0)
    return out, origins


def template_tools(setup: ToolSetup | None) -> list[dict[str, Any]] | None:
    """``tools`` for a template that renders them: OpenAI's shape
    (``{"type": "function", "function": {...}}``), or ``None``."""
    if setup is None:
        return None
    return [tool.model_dump(exclude_none=True) for tool in setup.tools]


def _function_line(tool: ToolDefinition) -> dict[str, Any]:
    function = tool.function
    line: dict[str, Any] = {"name": function.name}
    if function.description:
        line["description"] = function.description
    line["parameters"] = function.parameters or {"type": "object", "properties": {}}
    return line


def _history_block(call: MessageToolCall) -> str:
    return call_block(call.function.name, call.function.arguments)


def _tool_response(message: ChatMessage, names: dict[str, str]) -> str:
    call_id = message.tool_call_id or ""
    name = names.get(call_id) or message.name
    attributes = f"name={_json(name)} " if name else ""
    return (
        f"<tool_response {attributes}id={_json(call_id)}>{message.content}"
        "</tool_response>"
    )


def _native(message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    plain: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        plain["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.function.name,
                    "arguments": _arguments_value(call.function.arguments),
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        plain["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        plain["name"] = message.name
    if message.reasoning_content:
        plain["reasoning_content"] = message.reasoning_content
    return plain


def _arguments_value(arguments: str) -> Any:
    """Hugging Face templates expect the arguments as a mapping (they write it
    with ``tojson``); text that is not a JSON object stays text."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        raise RequestError(
            f"A tool cannot be shown to the model: {exc}", param="tools"
        ) from exc
