"""Responses input items as chat messages, with an open call cycle's reasoning.

Used by ``responses_api.to_chat_request``.

::

    {role, content} (type message)        -> a message (input_text/output_text
                                             parts joined)
    {type: function_call, call_id, ...}   -> an assistant message's tool_calls
    {type: function_call_output, ...}     -> a tool message (tool_call_id)
    {type: reasoning} of the open cycle   -> the reasoning_content of the
                                             assistant message its calls form
    other {type: reasoning} items         -> left out of the prompt

The open function-call cycle is the last run of ``reasoning`` and
``function_call`` items when only ``function_call_output`` items (at least one)
follow it: the model goes on from that reasoning, so OpenAI asks clients to
pass it back, and a thinking model's chat template renders a turn's
``reasoning_content`` after the last user query. Reasoning of earlier, closed
turns is left out, as those templates leave it out. A reasoning item's text is
its ``content`` parts of type ``reasoning_text`` (what this server writes), or
else its ``summary`` texts; an item with only ``encrypted_content`` adds nothing.

Spec: OpenAI API reference, "Responses", input item list ("Reasoning",
"Function tool call", "Function tool call output"); OpenAI guide "Reasoning
models", keeping reasoning items in context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sluicegate.core.errors import RequestError

__all__ = ["chat_messages", "open_cycle_reasoning"]

Item = tuple[dict[str, Any], str]
"""An input item and where it is in the request (``input[3]``), for errors."""


def chat_messages(
    items: Sequence[Item],
) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages ``items`` ask for, in order (see the module docstring),
    and where each came from: the item that began it (``input[2]``).

    Raises:
        RequestError: 400 for an item or part this server cannot take, naming
            it (``input[2].content[0].type``).
    """
    kept = open_cycle_reasoning([item for item, _ in items])
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    thoughts: list[str] = []
    for n, (item, at) in enumerate(items):
        if n in kept:
            thoughts += _reasoning_texts(item)
            continue
        _add_item(messages, item, at)
        origins += [at] * (len(messages) - len(origins))
        if thoughts and item.get("type") == "function_call":
            turn = messages[-1]
            before = [turn["reasoning_content"]] if "reasoning_content" in turn else []
            turn["reasoning_content"] = "\n".join([*before, *thoughts])
            thoughts = []
    return messages, origins


def open_cycle_reasoning(items: Sequence[dict[str, Any]]) -> set[int]:
    """The indices of the ``reasoning`` items of the open function-call cycle:
    those in the last run of ``reasoning`` and ``function_call`` items, when
    only ``function_call_output`` items (at least one) come after it."""
    n = len(items)
    while n > 0 and items[n - 1].get("type") == "function_call_output":
        n -= 1
    if n == len(items):
        return set()
    kept: set[int] = set()
    while n > 0 and items[n - 1].get("type") in ("function_call", "reasoning"):
        n -= 1
        if items[n].get("type") == "reasoning":
            kept.add(n)
    return kept


def _reasoning_texts(item: dict[str, Any]) -> list[str]:
    """The ``reasoning_text`` content of a reasoning item, else its summary."""
    for field, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(field)
        texts = [
            part["text"]
            for part in (parts if isinstance(parts, list) else ())
            if isinstance(part, dict)
            and part.get("type") == kind
            and isinstance(part.get("text"), str)
        ]
        if texts:
            return texts
    return []


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], at: str) -> None:
    """Append ``item`` as chat messages (a function call joins the assistant
    message before it, when that one only holds calls)."""
    kind = item.get("type", "message")
    if kind == "function_call":
        function = {"name": _str(item, "name", at), "arguments": _text(item, at)}
        call = {
            "id": _str(item, "call_id", at),
            "type": "function",
            "function": function,
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _parts(output, f"{at}.output")
        messages.append(
            {"role": "tool", "tool_call_id": _str(item, "call_id", at), "content": text}
        )
    elif kind == "reasoning":
        return  # not the open cycle's: left out (module docstring)
    elif kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise RequestError(f"Invalid role {role!r}", param=f"{at}.role")
        content = item.get("content", "")
        text = content if isinstance(content, str) else _parts(content, f"{at}.content")
        messages.append({"role": role, "content": text})
    else:
        raise RequestError(
            f"Input items of type {kind!r} are not supported",
            param=f"{at}.type",
            code="unsupported_parameter",
        )


def _str(item: dict[str, Any], name: str, at: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(
            f"Missing required parameter: '{at}.{name}'", param=f"{at}.{name}"
        )
    return value


def _parts(parts: object, at: str) -> str:
    """Text parts (``input_text``, ``output_text``) joined with newlines."""
    if not isinstance(parts, list):
        raise RequestError("Expected a string or a list of parts", param=at)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            raise RequestError(
                f"Content parts of type {kind!r} are not supported (this server"
                " serves text models)",
                param=f"{at}[{j}].type",
                code="unsupported_content",
            )
        texts.append(_text(part, f"{at}[{j}]", "text"))
    return "\n".join(texts)


def _text(item: dict[str, Any], at: str, name: str = "arguments") -> str:
    """``item[name]``, a string (``""`` when absent): a call's arguments are JSON
    text, a part's text is text; another type is a 400 naming it (a dict of
    arguments reached the chat checks, which named their own parameter, and a
    part's dict became its Python repr in the prompt)."""
    value = item.get(name, "")
    if not isinstance(value, str):
        raise RequestError(
            f"Invalid type for '{at}.{name}': expected a string, got "
            f"{type(value).__name__}",
            param=f"{at}.{name}",
            code="invalid_type",
        )
    return value
