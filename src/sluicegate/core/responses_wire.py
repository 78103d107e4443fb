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

Every ``response`` snapshot comes from ``response_object``. The states and
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

from collections.abc import Mapping
from typing import Any

from sluicegate.core.chunks import ResponseHeader, dumps
from sluicegate.core.endstate import EndState, classify
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
    ToolCallFragment,
    Usage,
)
from sluicegate.core.padding import MIN_STEP_BYTES, EventPadder, Filler
from sluicegate.core.sse import encode_comment
from sluicegate.core.stream import TRANSITIONS, Closing, Start, StreamState

__all__ = [
    "ECHO_DEFAULTS",
    "ResponsesStream",
    "response_body",
    "response_object",
    "usage_object",
]

_HEARTBEAT = encode_comment()


ECHO_DEFAULTS: Mapping[str, Any] = {
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "metadata": {},
    "text": {"format": {"type": "text"}},
}
"""The request fields a response object repeats, as a request without them
sets them; ``ResponseHeader.echo`` holds what the request did set."""


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
        "_call",
        "_gone",
        "_header",
        "_item",
        "_output",
        "_padder",
        "_pending",
        "_reason",
        "_seq",
        "_snapshot",
        "_state",
        "_written",
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
        self._seq = 0
        self._output: list[dict[str, Any]] = []
        self._item: dict[str, Any] | None = None  # the open output item
        self._call: int | None = None  # the open item's tool-call index
        self._pending = Closing()
        self._written = Closing()
        self._gone = False
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
        """The stream's end state from what was written (``classify``)."""
        w = self._written
        return classify(200, w.finishes, 1, w.done, w.error, client_gone=self._gone)

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
        return [_copy(item) for item in self._output]

    def wrote(self) -> None:
        """Report that every frame returned so far was written.

        Raises:
            LocalProtocolError: after ``write_failed()``.
        """
        if self._gone:
            raise LocalProtocolError("wrote() after write_failed()")
        self._written = self._written.plus(self._pending)
        self._pending = Closing()

    def write_failed(self) -> None:
        """Report that writing stopped before the frames since ``wrote()``."""
        self._gone = True
        self._pending = Closing()

    def start(self) -> list[bytes]:
        """``[response.created, response.in_progress]``.

        Raises:
            LocalProtocolError: not in state ``NEW``.
        """
        self._state = self._next(Start())
        snapshot = self._snapshot = response_object(self._header, "in_progress", [])
        return [
            self._event("response.created", {"response": snapshot}),
            self._event("response.in_progress", {"response": snapshot}),
        ]

    def feed(self, event: StreamEvent) -> list[bytes]:
        """Take one event; the frames to write now, in order (module docstring).

        Raises:
            LocalProtocolError: the event is not allowed in this state, or names
                a choice other than 0; nothing changes.
        """
        next_state = self._next(event)
        frames: list[bytes] = []
        match event:
            case Delta(text=text, parts=parts):
                if parts is not None and parts.reasoning:
                    self._thought(parts.reasoning, frames)
                if text:
                    self._text(text, frames)
                if parts is not None:
                    for fragment in parts.tool_calls:
                        self._fragment(fragment, frames)
            case Finish(finish_reason=reason):
                self._reason = reason
                self._close(frames)
                next_state = StreamState.AWAITING_END
                self._pending = self._pending.plus(Closing(finishes=1))
            case End(usage=usage):
                frames.append(self._terminal(usage))
                self._pending = self._pending.plus(Closing(done=True))
            case Fail(message=message, code=code):
                error = {"code": code or "server_error", "message": message}
                status = "cancelled" if code == CANCELLED else "failed"
                if self._item is not None:  # cut off: never completed
                    self._item["status"] = "incomplete"
                snapshot = self._snapshot = response_object(
                    self._header, status, self._output, error=error
                )
                frames.append(self._event("response.failed", {"response": snapshot}))
                self._pending = self._pending.plus(Closing(error=error))
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

    def _event(
        self, kind: str, fields: dict[str, Any], text: str | None = None
    ) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        if self._padder is not None:
            return self._padder.event(kind, payload, text)
        return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"

    def _open(self, item: dict[str, Any], frames: list[bytes]) -> None:
        self._close(frames)
        self._item = item
        self._output.append(item)
        added = {"output_index": len(self._output) - 1, "item": _copy(item)}
        frames.append(self._event("response.output_item.added", added))

    def _open_with_part(
        self,
        kind: str,
        prefix: str,
        fields: Mapping[str, Any],
        part: dict[str, Any],
        kept: dict[str, Any],
        frames: list[bytes],
    ) -> dict[str, Any]:
        """Open an item of type ``kind`` (id ``prefix_...``, ``fields`` after its
        status) with one content part: ``part`` announced, ``kept`` stored."""
        suffix = f"{self._header.id}_{len(self._output)}".removeprefix("resp_")
        item = {
            "id": f"{prefix}_{suffix}",
            "type": kind,
            "status": "in_progress",
            **fields,
            "content": [],
        }
        self._open(item, frames)
        self._call = None
        at = {"item_id": item["id"], "output_index": len(self._output) - 1}
        added = {**at, "content_index": 0, "part": part}
        frames.append(self._event("response.content_part.added", added))
        item["content"].append(kept)
        return item

    def _part_delta(self, item: dict[str, Any], text: str) -> dict[str, Any]:
        """``text`` added to ``item``'s one part; its delta event's fields."""
        item["content"][0]["text"] += text
        at = {"item_id": item["id"], "output_index": len(self._output) - 1}
        return {**at, "content_index": 0, "delta": text}

    def _thought(self, text: str, frames: list[bytes]) -> None:
        item = self._item
        if item is None or item["type"] != "reasoning":
            part = {"type": "reasoning_text", "text": ""}
            fields: dict[str, list[Any]] = {"summary": []}
            item = self._open_with_part(
                "reasoning", "rs", fields, part, dict(part), frames
            )
        delta = self._part_delta(item, text)
        frames.append(self._event("response.reasoning_text.delta", delta, text))

    def _text(self, text: str, frames: list[bytes]) -> None:
        item = self._item
        if item is None or item["type"] != "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            kept = {**part, "logprobs": []}
            fields = {"role": "assistant"}
            item = self._open_with_part("message", "msg", fields, part, kept, frames)
        delta = {**self._part_delta(item, text), "logprobs": []}
        frames.append(self._event("response.output_text.delta", delta, text))

    def _fragment(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        item = self._item
        if fragment.name is not None or self._call != fragment.index or item is None:
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
            self._call = fragment.index
        if fragment.arguments:
            item["arguments"] += fragment.arguments
            delta = {
                "item_id": item["id"],
                "output_index": len(self._output) - 1,
                "delta": fragment.arguments,
            }
            kind = "response.function_call_arguments.delta"
            frames.append(self._event(kind, delta, fragment.arguments))

    def _close(self, frames: list[bytes]) -> None:
        item = self._item
        if item is None:
            return
        self._item, self._call = None, None
        at = {"item_id": item["id"], "output_index": len(self._output) - 1}
        item["status"] = (
            "incomplete" if self._reason is FinishReason.LENGTH else "completed"
        )
        if item["type"] == "reasoning":
            content = item["content"][0]
            done = {**at, "content_index": 0, "text": content["text"]}
            frames.append(self._event("response.reasoning_text.done", done))
            part_done = {**at, "content_index": 0, "part": dict(content)}
            frames.append(self._event("response.content_part.done", part_done))
        elif item["type"] == "message":
            content = item["content"][0]
            done = {**at, "content_index": 0, "text": content["text"], "logprobs": []}
            frames.append(self._event("response.output_text.done", done))
            part = {k: v for k, v in content.items() if k != "logprobs"}
            part_done = {**at, "content_index": 0, "part": part}
            frames.append(self._event("response.content_part.done", part_done))
        else:
            done = {**at, "arguments": item["arguments"], "name": item["name"]}
            frames.append(self._event("response.function_call_arguments.done", done))
        output_index = at["output_index"]
        item_done = {"output_index": output_index, "item": _copy(item)}
        frames.append(self._event("response.output_item.done", item_done))

    def _terminal(self, usage: Usage) -> bytes:
        if self._reason is FinishReason.LENGTH:
            snapshot = self._snapshot = response_object(
                self._header,
                "incomplete",
                self._output,
                usage,
                incomplete_reason="max_output_tokens",
            )
            return self._event("response.incomplete", {"response": snapshot})
        snapshot = self._snapshot = response_object(
            self._header, "completed", self._output, usage
        )
        return self._event("response.completed", {"response": snapshot})


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """The item as it is now (its content parts copied: they grow)."""
    if item["type"] in ("message", "reasoning"):
        return {**item, "content": [dict(part) for part in item["content"]]}
    return dict(item)


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
