"""Anthropic's Messages API in front of the chat path: its body in, a chat request out.

A ``POST /v1/messages`` body is validated by its own models
(``server/schemas/anthropic_messages.py``: a 400 names the Messages API's
parameter, and what Anthropic's API refuses is refused there), then translated
into a chat-completions request that the chat planner checks and tokenizes as
any other (same template, tools, grammar, stop matcher, limits and engines,
upstream ones included):

::

    system (text or text blocks)         -> a system message
    messages[].content text blocks       -> the message's text
    assistant tool_use {id, name, input} -> tool_calls, arguments = JSON of input
    user tool_result {tool_use_id, ...}  -> a tool message (tool_call_id)
    max_tokens, stop_sequences           -> max_tokens, stop
    tools[{name, description, input_schema}] -> function tools
    tool_choice auto|any|tool|none       -> auto|required|named|none;
        disable_parallel_tool_use        -> parallel_tool_calls false
    output_config.format json_schema     -> response_format json_schema (strict)
    thinking {type: enabled, budget_tokens} -> chat_template_kwargs
        enable_thinking true (disabled: false), thinking_token_budget
    assistant thinking blocks of the open tool-use cycle -> reasoning_content
    other thinking / redacted_thinking blocks -> left out of the prompt

Earlier thinking
blocks are accepted with or without their ``signature``. Anthropic's API drops
the thinking of earlier turns from the context, except in a tool-use cycle that
is still open: the thinking of the assistant turn whose calls the user turns
after it answer stays, as the model goes on from it. It reaches the chat
template as that turn's ``reasoning_content`` (thinking models' templates render
it after the last user query); others, and encrypted ``redacted_thinking``
blocks, are left out. The answer is written
by ``core/wire/messages.py``; errors before the stream are in Anthropic's shape
(``errors.error_answer`` with ``Endpoint.MESSAGES``).

Spec: Anthropic API reference, "Messages", "Count message tokens", "Errors".
"""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.errors import RequestError
from sluicegate.server.schemas.anthropic_messages import (
    Message,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolChoice,
    ToolResultBlock,
    ToolUseBlock,
)
from sluicegate.server.schemas.translation import Translation, translate

__all__ = ["MESSAGES_PATHS", "to_chat_request"]

MESSAGES_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
"""The paths whose refusals (the guard's too) are in Anthropic's shape."""


def to_chat_request(request: MessagesRequest, *, max_tokens: int = 1) -> Translation:
    """The chat-completions request that asks for what ``request`` asks, and
    the Messages name of each of its messages (``system``, ``messages[1]``).

    Args:
        request: a validated Messages body.
        max_tokens: the limit when ``request`` has none (``count_tokens``).

    Raises:
        RequestError: 400 from the chat checks (e.g. a tool schema the
            constraint cannot express, naming the keyword).
    """
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    if request.system:
        messages.append({"role": "system", "content": _text(request.system)})
        origins.append("system")
    cycle = _open_cycle(request.messages)
    for i, message in enumerate(request.messages):
        messages += _chat_messages(message, thinking=i == cycle)
        origins += [f"messages[{i}]"] * (len(messages) - len(origins))
    body: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens or max_tokens,
        "stream": request.stream,
    }
    if request.stream:
        # The Messages API has no resumption: never logged, whatever the default.
        body["stream_options"] = {"include_usage": True, "resumable": False}
    if request.stop_sequences:
        body["stop"] = request.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    output = request.output_config
    if output is not None and output.format is not None:
        schema = {"name": "output", "schema": output.format.json_schema, "strict": True}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    if request.tools:
        body["tools"] = [_chat_tool(tool) for tool in request.tools]
    if request.tool_choice is not None:
        body.update(_chat_tool_choice(request.tool_choice, bool(request.tools)))
    if request.thinking is not None:
        kind = request.thinking.type
        body["chat_template_kwargs"] = {"enable_thinking": kind != "disabled"}
        if kind == "enabled":
            body["thinking_token_budget"] = request.thinking.budget_tokens
    return translate(body, origins)


def _text(content: str | list[TextBlock]) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(block.text for block in content)


def _open_cycle(messages: list[Message]) -> int | None:
    """The index of the assistant turn whose tool-use cycle is still open (the
    last one, when user turns follow it, each with a tool result), or ``None``.

    Spec: Anthropic, "Context windows", extended thinking with tool use.
    """
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].role == "assistant":
            return i if i < len(messages) - 1 else None
        content = messages[i].content
        if isinstance(content, str) or not any(
            isinstance(b, ToolResultBlock) for b in content
        ):
            return None
    return None


def _chat_messages(message: Message, thinking: bool) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: text, calls, and one tool message per
    result (results first, as they answer the previous turn's calls); with
    ``thinking``, its thinking blocks as the turn's ``reasoning_content``."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    thoughts: list[str] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            if thinking:  # the open cycle's: in the context (module docstring)
                thoughts.append(block.thinking)
        elif isinstance(block, RedactedThinkingBlock):
            continue  # encrypted: nothing a template can render
        elif isinstance(block, ToolUseBlock):
            arguments = orjson.dumps(block.input).decode()
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        else:
            text = _text(block.content)
            content = f"Error: {text}" if block.is_error else text
            results.append(
                {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}
            )
    out = results
    if texts or calls or not results:
        turn: dict[str, Any] = {"role": message.role, "content": "\n".join(texts)}
        if calls:
            turn["tool_calls"] = calls
        if thoughts:
            turn["reasoning_content"] = "\n".join(thoughts)
        out = [*results, turn]
    return out


def _chat_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: ToolChoice, has_tools: bool) -> dict[str, Any]:
    if choice.type == "tool" and choice.name is None:
        raise RequestError(
            "tool_choice of type 'tool' needs a name", param="tool_choice.name"
        )
    if choice.type in ("any", "tool") and not has_tools:  # it would answer in words
        raise RequestError("a forced tool_choice needs tools", param="tool_choice")
    if choice.type == "none" or not has_tools:
        return {"tool_choice": "none"} if has_tools else {}
    named = {"type": "function", "function": {"name": choice.name}}
    forced = {"tool": named, "any": "required", "auto": "auto"}[choice.type]
    out = {"parallel_tool_calls": not choice.disable_parallel_tool_use}
    return {**out, "tool_choice": forced}
