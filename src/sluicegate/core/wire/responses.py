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
``response`` snapshot comes from ``response_object``. The states and
their legal events are ``stream.TRANSITIONS``; ``outcome`` is ``classify()`` of
what was written: finished once the terminal event was written (completed or
incomplete), errored once ``response.failed`` was, aborted when the writing
failed before either.

The reasoning is the model's own text, so it is a ``reasoning_text`` content
part of the reasoning item (the events OpenAI defines for open-weight models'
raw reasoning), not a ``summary``, which sluicegate never writes.

Spec: OpenAI API reference, "Responses", "The response object" and "Streaming
events" (``response.reasoning_text.delta``).
"""

from __future__ import annotations

from typing import Any

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    CANCELLED,
    Delta,
    DeltaParts,
    End,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    Usage,
)
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.padding import MIN_STEP_BYTES, EventPadder, Filler
from sluicegate.core.wire.responses_items import (
    ECHO_DEFAULTS,
    OutputItems,
    response_object,
    usage_object,
)
from sluicegate.core.wire.sse import encode_comment
from sluicegate.core.wire.stream import TRANSITIONS, Start, StreamState
from sluicegate.core.wire.written import WriteRecord

__all__ = [
    "ECHO_DEFAULTS",
    "ResponsesStream",
    "response_body",
    "response_object",
    "usage_object",
]

_HEARTBEAT = encode_comment()
# The state where a ``Delta`` is legal, which it stays in (see ``stream.py``).
_DELTA_STATE = StreamState.STREAMING


class ResponsesStream:
    """feed(event) -> Responses API SSE frames (bytes); see the module docstring.

    Args:
        header: the response's shared fields (``n`` must be 1).
        filler: pad every event (``padding.EventPadder``, the ``obfuscation``
            field); ``None`` for no padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n != 1``.
    """

    __slots__ = (
        "_header",
        "_items",
        "_padder",
        "_reason",
        "_record",
        "_snapshot",
        "_state",
    )

    def __init__(
        self,
        header: ResponseHeader,
        filler: Filler | None = None,
        pad_step_bytes: int = MIN_STEP_BYTES,
    ) -> None:
        if header.n != 1:
            raise ValueError(f"a response has one output, got n={header.n!r}")
        self._padder = (
            EventPadder(filler, pad_step_bytes) if filler is not None else None
        )
        self._header = header
        self._state = StreamState.NEW
        self._reason: FinishReason | None = None
        self._items = OutputItems(header, self._padder)
        self._record = WriteRecord()
        self._snapshot: dict[str, Any] | None = None

    @property
    def header(self) -> ResponseHeader:
        """The response's shared fields."""
        return self._header

    @property
    def state(self) -> StreamState:
        """The current state."""
        return self._state

    @property
    def end_state(self) -> EndState | None:
        """``FINISHED`` or ``ERRORED`` once terminal; ``None`` before."""
        if self._state is StreamState.FINISHED:
            return EndState.FINISHED
        if self._state is StreamState.ERRORED:
            return EndState.ERRORED
        return None

    @property
    def outcome(self) -> EndState:
        """The stream's end state from what was written (``WriteRecord``)."""
        return self._record.outcome(1)

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """The one output's finish reason (``None`` while it is open)."""
        return (self._reason,)

    @property
    def snapshot(self) -> dict[str, Any] | None:
        """The last ``response`` object written (``response.created``, then the
        terminal event's); ``None`` before ``start()``."""
        return self._snapshot

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items so far, as the ``response`` object lists them."""
        return self._items.output()

    def wrote(self) -> None:
        """Report that every frame returned so far was written.

        Raises:
            LocalProtocolError: after ``write_failed()``.
        """
        self._record.wrote()

    def write_failed(self) -> None:
        """Report that writing stopped before the frames since ``wrote()``."""
        self._record.write_failed()

    def start(self) -> list[bytes]:
        """``[response.created, response.in_progress]``.

        Raises:
            LocalProtocolError: not in state ``NEW``.
        """
        self._state = self._next(Start())
        snapshot = self._snapshot = response_object(self._header, "in_progress", [])
        event = self._items.event
        return [
            event("response.created", {"response": snapshot}),
            event("response.in_progress", {"response": snapshot}),
        ]

    def feed(self, event: StreamEvent) -> list[bytes]:
        """Take one event; the frames to write now, in order (module docstring).

        Raises:
            LocalProtocolError: the event is not allowed in this state, or names
                a choice other than 0; nothing changes.
        """
        if (
            type(event) is Delta
            and self._state is _DELTA_STATE
            and event.parts is None
            and event.index == 0
            and event.text
        ):
            # Once per token: text added to the open message, from its template.
            frame = self._items.text_frame(event.text)
            if frame is not None:
                return [frame]
        next_state = self._next(event)
        frames: list[bytes] = []
        items = self._items
        match event:
            case Delta(text=text, parts=parts):
                if parts is not None and parts.reasoning:
                    items.thought(parts.reasoning, frames)
                if text:
                    items.text(text, frames)
                if parts is not None:
                    for fragment in parts.tool_calls:
                        items.fragment(fragment, frames)
            case Finish(finish_reason=reason):
                self._reason = reason
                items.close(reason, frames)
                next_state = StreamState.AWAITING_END
                self._record.add(finishes=1)
            case End(usage=usage):
                frames.append(self._terminal(usage))
                self._record.add(done=True)
            case Fail(message=message, code=code):
                error = {"code": code or "server_error", "message": message}
                status = "cancelled" if code == CANCELLED else "failed"
                snapshot = self._snapshot = response_object(
                    self._header, status, items.cut(), error=error
                )
                frames.append(items.event("response.failed", {"response": snapshot}))
                self._record.add(error=error)
            case _:
                padder = self._padder
                frames.append(_HEARTBEAT if padder is None else padder.keep_alive())
        self._state = next_state
        return frames

    def _next(self, event: StreamEvent | Start) -> StreamState:
        next_state = TRANSITIONS.get((self._state, type(event)))
        if next_state is None:
            raise LocalProtocolError(
                f"{type(event).__name__} is not allowed in state {self._state.name}"
            )
        if isinstance(event, Delta | Finish) and event.index != 0:
            raise LocalProtocolError(
                f"{type(event).__name__} for choice {event.index!r}, but a response"
                " has one output"
            )
        return next_state

    def _terminal(self, usage: Usage) -> bytes:
        output = self._items.output()
        if self._reason is FinishReason.LENGTH:
            snapshot = self._snapshot = response_object(
                self._header,
                "incomplete",
                output,
                usage,
                incomplete_reason="max_output_tokens",
            )
            return self._items.event("response.incomplete", {"response": snapshot})
        snapshot = self._snapshot = response_object(
            self._header, "completed", output, usage
        )
        return self._items.event("response.completed", {"response": snapshot})


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
    length = whole.finish_reason is FinishReason.LENGTH
    status = "incomplete" if length else "completed"
    reason = "max_output_tokens" if length else None
    return response_object(header, status, machine.output, whole.usage, None, reason)
