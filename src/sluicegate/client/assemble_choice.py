"""One choice of a chat or completions stream, assembled from its chunks: text,
reasoning, role, finish reason, tool calls and logprobs.

``StreamAssembler`` (``assemble.py``) keeps one ``ChoiceParts`` per choice index
and hands each chunk's entry to ``take``; ``freeze`` gives the ``ChoiceResult``.
The rules for tool calls without an ``index`` and for reasoning fields are in
``assemble.py``'s docstring.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from sluicegate.client.results import ChoiceResult, TextDelta, ToolCall

__all__ = ["ChoiceParts"]


class ChoiceParts:
    """One choice's parts as they arrive (mutable: ``freeze`` makes its result)."""

    __slots__ = (
        "finish_reason",
        "latest_call",
        "logprobs",
        "parts",
        "reasoning",
        "role",
        "tools",
    )

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.reasoning: list[str] = []
        self.finish_reason: str | None = None
        self.role: str | None = None
        self.logprobs: list[Mapping[str, Any]] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.latest_call: int | None = None  # the call an entry without index continues

    def take(self, wire: dict[str, Any]) -> TextDelta | None:
        """One chunk's entry of this choice (``wire``: its ``choices`` item) taken;
        the delta it gives the reader, or ``None``."""
        index: int = wire["index"]
        if wire.get("finish_reason") is not None:
            self.finish_reason = str(wire["finish_reason"])
        _take_logprobs(self, wire.get("logprobs"))
        delta = wire.get("delta")
        if isinstance(delta, dict):
            if self.role is None and isinstance(delta.get("role"), str):
                self.role = delta["role"]
            _take_tool_calls(self, delta.get("tool_calls"))
            # reasoning_content (sluicegate, vLLM, SGLang, llama.cpp's server),
            # else reasoning (newer vLLM, which may send both: taken once).
            thought = delta.get("reasoning_content")
            if not isinstance(thought, str) or not thought:
                thought = delta.get("reasoning")
            thought = thought if isinstance(thought, str) else ""
            self.reasoning.append(thought)
            text = delta.get("content")
        else:
            text, thought = wire.get("text"), ""
        text = text if isinstance(text, str) else ""
        self.parts.append(text)
        return TextDelta(index, text, thought) if text or thought else None

    def freeze(self, index: int) -> ChoiceResult:
        calls = [
            ToolCall(i, t["id"], t["type"], "".join(t["name"]), "".join(t["args"]))
            for i, t in sorted(self.tools.items())
        ]
        complete = [call for call in calls if _whole_json(call.arguments)]
        return ChoiceResult(
            index,
            "".join(self.parts),
            self.finish_reason,
            self.role,
            tuple(self.logprobs),
            tuple(complete),
            tuple(call for call in calls if call not in complete),
            "".join(self.reasoning),
        )


def _whole_json(text: str) -> bool:
    """Whether a call's arguments are whole JSON: a client may act on it."""
    try:
        orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return True


def _take_tool_calls(choice: ChoiceParts, calls: Any) -> None:
    if not isinstance(calls, list):
        return
    for call in calls:
        if not isinstance(call, dict):
            continue
        index = call.get("index")
        if not isinstance(index, int):
            index = _unindexed(choice, call.get("id"))
        choice.latest_call = index
        slot = choice.tools.setdefault(
            index, {"id": None, "type": None, "name": [], "args": []}
        )
        slot["id"] = slot["id"] or call.get("id")
        slot["type"] = slot["type"] or call.get("type")
        function = call.get("function")
        if isinstance(function, dict):
            slot["name"].append(function.get("name") or "")
            slot["args"].append(function.get("arguments") or "")


def _unindexed(choice: ChoiceParts, call_id: Any) -> int:
    """The index of a call entry that has none: a new ``id`` begins the next
    call, anything else continues the latest call (0 when there is none)."""
    tools = choice.tools
    if call_id is None or any(t["id"] == call_id for t in tools.values()):
        return 0 if choice.latest_call is None else choice.latest_call
    return max(tools, default=-1) + 1


def _take_logprobs(choice: ChoiceParts, logprobs: Any) -> None:
    if not isinstance(logprobs, dict):
        return
    if isinstance(content := logprobs.get("content"), list):
        choice.logprobs.extend(e for e in content if isinstance(e, dict))
        return
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list):  # completions: parallel lists
        values = logprobs.get("token_logprobs") or [None] * len(tokens)
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        choice.logprobs.extend(
            {"token": t, "logprob": v, "top_logprobs": top}
            for t, v, top in zip(tokens, values, tops, strict=False)
        )
