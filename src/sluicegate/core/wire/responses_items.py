"""The Responses API's output items: the ``response`` object and the events that
open, grow and close each item of one stream.

``OutputItems`` numbers every event of its stream (``sequence_number`` from 0 by
one) and pads it when given a padder; ``ResponsesStream`` (``responses.py``, a
``blocks.BlockMachine``) decides which of its methods a core event calls. A
text delta of an open message comes from a template
(``templates.EventTemplate``): the JSON of its text and its sequence number
between prebuilt bytes. An item's text is kept as pieces,
joined when the item closes or its output is read, so a long answer costs no
copy per token.

Spec: OpenAI API reference, "Responses", "The response object" and "Streaming
events".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.core.events import FinishReason, ToolCallFragment, Usage
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.padding import EventPadder, typed_event
from sluicegate.core.wire.templates import NUMBER_MARK, TEXT_MARK, EventTemplate

__all__ = ["ECHO_DEFAULTS", "OutputItems", "response_object", "usage_object"]

ECHO_DEFAULTS: Mapping[str, Any] = {
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "metadata": {},
    "text": {"format": {"type": "text"}},
}
"""The request fields a response object repeats, as a request without them
sets them; ``ResponseHeader.echo`` holds what the request did set."""

_TEXT_DELTA = "response.output_text.delta"


def usage_object(usage: Usage) -> dict[str, Any]:
    """``{input_tokens, input_tokens_details, output_tokens,
    output_tokens_details, total_tokens}`` (tokens); ``reasoning_tokens`` is 0
    for a response without a reasoning channel."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def response_object(
    header: ResponseHeader,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None = None,
    error: Mapping[str, Any] | None = None,
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """The ``response`` object: its id, status and output items so far.

    Args:
        header: id, created (Unix seconds) and model.
        status: ``in_progress``, ``completed``, ``incomplete``, ``failed`` or
            ``cancelled``.
        output: the output items (``message`` and ``function_call``).
        usage: the token counts, once known.
        error: ``{code, message}`` of a failed response.
        incomplete_reason: e.g. ``max_output_tokens``.

    The request's ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``text``,
    ``metadata`` (and the other fields in ``header.echo``) are repeated as it
    set them, else as ``ECHO_DEFAULTS``.
    """
    incomplete = {"reason": incomplete_reason} if incomplete_reason else None
    return {
        "id": header.id,
        "object": "response",
        "created_at": header.created,
        "status": status,
        "model": header.model,
        "output": output,
        "error": dict(error) if error is not None else None,
        "incomplete_details": incomplete,
        "usage": usage_object(usage) if usage is not None else None,
        **ECHO_DEFAULTS,
        **(header.echo or {}),
    }


_COMPLETE = frozenset({FinishReason.STOP, FinishReason.TOOL_CALLS})
"""The finishes whose output items are ``completed`` (others: ``incomplete``)."""


class OutputItems:
    """The output items of one Responses stream, and their events (bytes).

    Args:
        header: the response's id (the items' ids derive from it).
        padder: pads every event (``EventPadder``), or ``None``.

    ``ResponsesStream`` (a ``blocks.BlockMachine``) decides when an item opens
    and closes; it opens one only while none is open. Each method appends the
    frames of what it did to ``frames``.
    """

    __slots__ = (
        "_header",
        "_item",
        "_output",
        "_padder",
        "_pieces",
        "_seq",
        "_template",
    )

    def __init__(self, header: ResponseHeader, padder: EventPadder | None) -> None:
        self._header = header
        self._padder = padder
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._item: dict[str, Any] | None = None  # the open output item
        self._pieces: list[str] = []  # the open item's part text, not joined yet
        self._template: EventTemplate | None = None  # the open message's delta

    def event(
        self, kind: str, fields: dict[str, Any], text: str | None = None
    ) -> bytes:
        """The next event: ``type`` ``kind``, its sequence number, ``fields``
        (``text``: a delta's, for its padding)."""
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        if self._padder is not None:
            return self._padder.event(kind, payload, text)
        return typed_event(kind, payload)

    def output(self) -> list[dict[str, Any]]:
        """The output items so far, each as it is now (copies)."""
        self._join()
        return [_copy(item) for item in self._output]

    def cut(self) -> list[dict[str, Any]]:
        """``output()`` with the open item, if any, marked ``incomplete``: the
        output of a response cut off by a failure."""
        if self._item is not None:
            self._item["status"] = "incomplete"
        return self.output()

    def text_frame(self, text: str) -> bytes:
        """The delta of non-empty ``text`` added to the open message, from its
        template (``open_message`` opened it)."""
        template = self._template
        assert template is not None
        self._pieces.append(text)
        seq = self._seq
        self._seq = seq + 1
        return template.frame(text, seq)

    def open_message(self, frames: list[bytes]) -> None:
        """Open a message item and its ``output_text`` part (``text_frame`` then
        writes its deltas)."""
        part = {"type": "output_text", "text": "", "annotations": []}
        kept = {**part, "logprobs": []}
        fields = {"role": "assistant"}
        item = self._open_with_part("message", "msg", fields, part, frames)
        item["content"].append(kept)
        delta = {"content_index": 0, "delta": TEXT_MARK, "logprobs": []}
        payload = {
            "type": _TEXT_DELTA,
            "sequence_number": NUMBER_MARK,
            **self._at(item),
            **delta,
        }
        self._template = EventTemplate(_TEXT_DELTA, payload, self._padder)

    def open_reasoning(self, frames: list[bytes]) -> None:
        """Open a reasoning item and its ``reasoning_text`` part."""
        part = {"type": "reasoning_text", "text": ""}
        fields: dict[str, Any] = {"summary": []}
        item = self._open_with_part("reasoning", "rs", fields, part, frames)
        item["content"].append(dict(part))

    def thought(self, text: str, frames: list[bytes]) -> None:
        """Reasoning ``text`` added to the open reasoning item."""
        item = self._item
        assert item is not None  # ``open_reasoning`` opened it
        self._pieces.append(text)
        delta = {**self._at(item), "content_index": 0, "delta": text}
        frames.append(self.event("response.reasoning_text.delta", delta, text))

    def open_call(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        """Open the ``function_call`` item of ``fragment``'s call."""
        call_id = fragment.id or f"call_{len(self._output)}"
        item = {
            "id": f"fc_{call_id.removeprefix('call_')}",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": fragment.name or "",
            "arguments": "",
        }
        self._open(item, frames)

    def arguments(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        """``fragment``'s arguments added to the open ``function_call`` item."""
        item = self._item
        assert item is not None  # ``open_call`` opened it
        item["arguments"] += fragment.arguments
        delta = {**self._at(item), "delta": fragment.arguments}
        kind = "response.function_call_arguments.delta"
        frames.append(self.event(kind, delta, fragment.arguments))

    def close(self, reason: FinishReason | None, frames: list[bytes]) -> None:
        """Close the open item: its done events (``incomplete`` when the output
        was cut by the length limit)."""
        item = self._item
        assert item is not None
        self._join()
        self._item, self._template = None, None
        at = self._at(item)
        item["status"] = (
            "completed" if reason is None or reason in _COMPLETE else "incomplete"
        )
        if item["type"] == "function_call":
            done = {**at, "arguments": item["arguments"], "name": item["name"]}
            frames.append(self.event("response.function_call_arguments.done", done))
        else:
            content = item["content"][0]
            done = {**at, "content_index": 0, "text": content["text"]}
            if item["type"] == "reasoning":
                frames.append(self.event("response.reasoning_text.done", done))
                part = dict(content)
            else:
                done["logprobs"] = []
                frames.append(self.event("response.output_text.done", done))
                part = {k: v for k, v in content.items() if k != "logprobs"}
            part_done = {**at, "content_index": 0, "part": part}
            frames.append(self.event("response.content_part.done", part_done))
        item_done = {"output_index": at["output_index"], "item": _copy(item)}
        frames.append(self.event("response.output_item.done", item_done))

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": len(self._output) - 1}

    def _open(self, item: dict[str, Any], frames: list[bytes]) -> None:
        self._item = item
        self._output.append(item)
        added = {"output_index": len(self._output) - 1, "item": _copy(item)}
        frames.append(self.event("response.output_item.added", added))

    def _open_with_part(
        self,
        kind: str,
        prefix: str,
        fields: Mapping[str, Any],
        part: dict[str, Any],
        frames: list[bytes],
    ) -> dict[str, Any]:
        """Open an item of type ``kind`` (id ``prefix_...``, ``fields`` after its
        status) and announce its one content part ``part``; the caller stores
        the part it keeps."""
        suffix = f"{self._header.id}_{len(self._output)}".removeprefix("resp_")
        item = {
            "id": f"{prefix}_{suffix}",
            "type": kind,
            "status": "in_progress",
            **fields,
            "content": [],
        }
        self._open(item, frames)
        self._pieces = []
        added = {**self._at(item), "content_index": 0, "part": part}
        frames.append(self.event("response.content_part.added", added))
        return item

    def _join(self) -> None:
        """Write the open item's text pieces into its content part."""
        item = self._item
        if item is not None and item["type"] != "function_call" and item["content"]:
            item["content"][0]["text"] = "".join(self._pieces)


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as it is now (its content parts copied: they grow)."""
    if item["type"] in ("message", "reasoning"):
        return {**item, "content": [dict(part) for part in item["content"]]}
    return dict(item)
