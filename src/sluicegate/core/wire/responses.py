"""The Responses API's stream machine and bodies: typed events from the core's.

``ResponsesStream`` takes the same events as ``stream.StreamMachine`` (one
output) and writes the Responses API's streaming events: ``event: <type>`` then
one ``data:`` line of compact JSON with that ``type`` and a ``sequence_number``
that counts from 0 by one:

::

    start()          response.created, response.in_progress (status in_progress)
    Delta reasoning  a reasoning item when none is open: output_item.added
                     {type: reasoning, summary: [], content: []},
                     response.content_part.added {type: reasoning_text}; then
                     response.reasoning_text.delta
    Delta text       a message item when none is open (closing a function call
                     first): response.output_item.added,
                     response.content_part.added; then response.output_text.delta
    Delta tool call  the open item's done events, then on the call's first
                     fragment response.output_item.added {type: function_call};
                     response.function_call_arguments.delta per piece
    Finish           the open item's done events: response.output_text.done
                     (response.reasoning_text.done for a reasoning item),
                     response.content_part.done, response.output_item.done, or
                     response.function_call_arguments.done,
                     response.output_item.done
    End              exactly one terminal event: response.completed, or
                     response.incomplete {incomplete_details: {reason:
                     max_output_tokens}} when the output was cut by the limit
    Fail             response.failed {response: {status: failed, error}};
                     nothing after it (status cancelled for code cancelled:
                     the Responses API has no event of its own for it)
    Heartbeat        an SSE comment (the Responses API has no ping event)

With a filler, every event is padded (``padding.EventPadder``): an
``obfuscation`` field last, as OpenAI's ``stream_options.include_obfuscation``
adds to its deltas; a heartbeat comment has the last delta's size.

The output items and their events are ``responses_items.OutputItems``' (a
text delta of an open message from a template, ``templates.py``); every
``response`` snapshot comes from ``response_object``. The states, their legal
events and when an item opens are ``blocks.BlockMachine``'s; ``outcome`` is
``classify()`` of what was written: finished once the terminal event was
written (completed or incomplete), errored once ``response.failed`` was,
aborted when the writing failed before either.

The reasoning is the model's own text, so it is a ``reasoning_text`` content
part of the reasoning item (the events OpenAI defines for open-weight models'
raw reasoning), not a ``summary``, which sluicegate never writes.

Spec: OpenAI API reference, "Responses", "The response object" and "Streaming
events" (``response.reasoning_text.delta``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.core.events import (
    CANCELLED,
    Delta,
    DeltaParts,
    Fail,
    Finish,
    FinishReason,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.blocks import BlockMachine
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.padding import Filler
from sluicegate.core.wire.responses_items import (
    ECHO_DEFAULTS,
    OutputItems,
    response_object,
    usage_object,
)
from sluicegate.core.wire.sse import encode_comment

__all__ = [
    "ECHO_DEFAULTS",
    "INCOMPLETE_REASONS",
    "ResponsesStream",
    "response_body",
    "response_object",
    "usage_object",
]

_HEARTBEAT = encode_comment()

INCOMPLETE_REASONS: dict[FinishReason | None, str] = {
    FinishReason.LENGTH: "max_output_tokens",
    FinishReason.CONTENT_FILTER: "content_filter",
}
"""The finishes that end a response ``incomplete``, with their
``incomplete_details.reason`` (Responses API reference, "The response object")."""


class ResponsesStream(BlockMachine):
    """feed(event) -> Responses API SSE frames (bytes); see the module docstring.

    A ``blocks.BlockMachine``: the states, the open item and when the next one
    opens are decided there; the items and their events are ``OutputItems``'.

    Args:
        header: the response's shared fields (``n`` must be 1).
        filler: pad every event (``blocks.BlockMachine``); ``None`` for no
            padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n != 1``.
    """

    __slots__ = ("_items", "_snapshot")

    def _prepare(self, filler: Filler | None, pad_step_bytes: int) -> None:
        super()._prepare(filler, pad_step_bytes)
        self._items = OutputItems(self._header, self._padder)
        self._snapshot: dict[str, Any] | None = None

    @property
    def snapshot(self) -> dict[str, Any] | None:
        """The last ``response`` object written (``response.created``, then the
        terminal event's); ``None`` before ``start()``."""
        return self._snapshot

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items so far, as the ``response`` object lists them."""
        return self._items.output()

    def _opening(self) -> list[bytes]:
        snapshot = self._snapshot = response_object(self._header, "in_progress", [])
        event = self._items.event
        return [
            event("response.created", {"response": snapshot}),
            event("response.in_progress", {"response": snapshot}),
        ]

    def _open_reasoning(self, frames: list[bytes]) -> None:
        self._items.open_reasoning(frames)

    def _reasoning(self, text: str, frames: list[bytes]) -> None:
        self._items.thought(text, frames)

    def _open_text(self, frames: list[bytes]) -> None:
        self._items.open_message(frames)
        self._text_frame = self._items.text_frame

    def _open_call(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        self._items.open_call(fragment, frames)

    def _arguments(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        self._items.arguments(fragment, frames)

    def _close_block(
        self, block: str | int, reason: FinishReason | None, frames: list[bytes]
    ) -> None:
        self._items.close(reason, frames)

    def _end(self, usage: Usage) -> list[bytes]:
        output = self._items.output()
        reason = INCOMPLETE_REASONS.get(self._finish_reasons[0])
        if reason is not None:
            snapshot = self._snapshot = response_object(
                self._header, "incomplete", output, usage, incomplete_reason=reason
            )
            return [self._items.event("response.incomplete", {"response": snapshot})]
        snapshot = self._snapshot = response_object(
            self._header, "completed", output, usage
        )
        return [self._items.event("response.completed", {"response": snapshot})]

    def _fail(self, event: Fail) -> tuple[list[bytes], Mapping[str, Any]]:
        code = event.code
        error = {"code": code or "server_error", "message": event.message}
        status = "cancelled" if code == CANCELLED else "failed"
        items = self._items
        snapshot = self._snapshot = response_object(
            self._header, status, items.cut(), error=error
        )
        return [items.event("response.failed", {"response": snapshot})], error

    def _heartbeat(self) -> bytes:
        padder = self._padder
        return _HEARTBEAT if padder is None else padder.keep_alive()


def response_body(header: ResponseHeader, whole: Any) -> dict[str, Any]:
    """The non-streamed ``response`` object of a finished response.

    Args:
        header: id, created and model.
        whole: a ``wire.Whole``: text, finish reason, usage, calls, reasoning.

    Returns:
        ``response_object`` with status ``completed`` (``incomplete`` with
        reason ``max_output_tokens`` when cut by the limit) and the output: a
        reasoning item when there is reasoning, a message item when there is
        text, then one ``function_call`` item per call, with the ids the
        stream would have given them.
    """
    machine = ResponsesStream(header)
    machine.start()
    if whole.reasoning:
        machine.feed(Delta(0, "", parts=DeltaParts(reasoning=whole.reasoning)))
    parts = DeltaParts(tuple(whole.tool_calls)) if whole.tool_calls else None
    machine.feed(Delta(0, whole.text, parts=parts))
    machine.feed(Finish(0, whole.finish_reason or FinishReason.STOP))
    reason = INCOMPLETE_REASONS.get(whole.finish_reason)
    status = "incomplete" if reason is not None else "completed"
    return response_object(header, status, machine.output, whole.usage, None, reason)
