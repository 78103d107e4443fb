"""The Messages API's stream machine and bodies: Anthropic's events from the core's.

``MessagesStream`` takes the same events as ``stream.StreamMachine`` (one choice)
and writes Anthropic's streaming events, each ``event: <type>`` then one
``data:`` line of compact JSON whose ``type`` repeats the event's name:

::

    start()          message_start (usage: input_tokens, the two cache
                     counts, output_tokens 0)
    Delta reasoning  content_block_start {type: thinking, thinking: "",
                     signature: ""} when no thinking block is open, then
                     content_block_delta {thinking_delta}; the block closes
                     with one content_block_delta {signature_delta} before
                     its content_block_stop
    Delta text       content_block_start {type: text} when no text block is
                     open (closing a tool_use block first), then
                     content_block_delta {text_delta}
    Delta tool call  content_block_stop of the open block, content_block_start
                     {type: tool_use, id, name, input: {}} on the call's first
                     fragment, content_block_delta {input_json_delta} per
                     piece of its arguments
    Finish           content_block_stop of the open block
    End              message_delta {stop_reason, stop_sequence; usage},
                     message_stop
    Fail             one error event {type: error, error: {type, message}};
                     nothing after it
    Heartbeat        ping

A text delta of an open text block comes from a template (``templates.py``);
the objects the stream shares with the whole body are ``messages_bodies.py``'s.
The states and their legal events are ``stream.TRANSITIONS``; ``outcome`` is
``classify()`` of what was written, as for chat: finished once ``message_stop``
was written, errored once the error event was, aborted when the writing failed
before either.

With a filler, every event is padded (``padding.EventPadder``): the Messages
API has no padding field of its own, so the pad is an ``obfuscation`` field
last, which Anthropic's SDKs ignore as any unknown field; a ``ping`` has the
last delta's size.

A thinking block's ``signature`` is ``thinking_signature`` of its text: a
digest, not a secret (the server keeps no key, and a request's earlier thinking
blocks are accepted and left out of the prompt, as Anthropic's API leaves them
out of the context, so nothing relies on it being unforgeable).

Spec: Anthropic API reference, "Messages" and "Streaming messages"; "Errors";
"Extended thinking".
"""

from __future__ import annotations

from typing import Any

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    End,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.chunks import ResponseHeader, dumps
from sluicegate.core.wire.messages_bodies import (
    ERROR_TYPES,
    ThinkingDigest,
    message_body,
    message_error_body,
    stop_reason,
    thinking_signature,
    usage_object,
)
from sluicegate.core.wire.padding import MIN_STEP_BYTES, EventPadder, Filler
from sluicegate.core.wire.stream import TRANSITIONS, Start, StreamState
from sluicegate.core.wire.templates import TEXT_MARK, EventTemplate
from sluicegate.core.wire.written import WriteRecord

# The state where a ``Delta`` is legal, which it stays in (see ``stream.py``).
_DELTA_STATE = StreamState.STREAMING

__all__ = [
    "ERROR_TYPES",
    "MessagesStream",
    "message_body",
    "message_error_body",
    "stop_reason",
    "thinking_signature",
    "usage_object",
]

_PING = b'event: ping\ndata: {"type":"ping"}\n\n'
_BLOCK_DELTA = "content_block_delta"


def _ping() -> dict[str, Any]:
    return {"type": "ping"}


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


class MessagesStream:
    """feed(event) -> Anthropic SSE frames (bytes); see the module docstring.

    Args:
        header: the response's shared fields (``n`` must be 1;
            ``prompt_tokens`` is the usage's ``input_tokens``).
        filler: pad every event (``padding.EventPadder``, an ``obfuscation``
            field that Anthropic's clients ignore); ``None`` for no padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n != 1``.
    """

    __slots__ = (
        "_block",
        "_header",
        "_index",
        "_padder",
        "_reason",
        "_record",
        "_state",
        "_stop",
        "_template",
        "_thinking",
    )

    def __init__(
        self,
        header: ResponseHeader,
        filler: Filler | None = None,
        pad_step_bytes: int = MIN_STEP_BYTES,
    ) -> None:
        if header.n != 1:
            raise ValueError(f"a message has one output, got n={header.n!r}")
        self._padder = (
            EventPadder(filler, pad_step_bytes) if filler is not None else None
        )
        self._header = header
        self._state = StreamState.NEW
        self._reason: FinishReason | None = None
        self._stop: str | None = None
        # The open content block: None, "thinking", "text", or a call's index.
        self._block: str | int | None = None
        self._thinking = ThinkingDigest()
        self._index = -1  # the open (or last) content block's index
        self._template: EventTemplate | None = None  # the open text block's delta
        self._record = WriteRecord()

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
        """``[message_start]``.

        Raises:
            LocalProtocolError: not in state ``NEW``.
        """
        self._state = self._next(Start())
        header = self._header
        message: dict[str, Any] = {
            "id": header.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": header.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_object(Usage(header.prompt_tokens, 0, header.cached_tokens)),
        }
        start = {"type": "message_start", "message": message}
        return [self._emit("message_start", start)]

    def feed(self, event: StreamEvent) -> list[bytes]:
        """Take one event; the frames to write now, in order (module docstring).

        Raises:
            LocalProtocolError: the event is not allowed in this state, or names
                a choice other than 0; nothing changes.
        """
        template = self._template
        if (
            template is not None
            and type(event) is Delta
            and self._state is _DELTA_STATE
            and event.parts is None
            and event.index == 0
            and event.text
        ):
            # Once per token: text added to the open text block, from its template.
            return [template.frame(event.text)]
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
                        self._call(fragment, frames)
            case Finish(finish_reason=reason, stop_sequence=stop):
                self._close(frames)
                self._reason = reason
                self._stop = stop
                next_state = StreamState.AWAITING_END
                self._record.add(finishes=1)
            case End(usage=usage):
                frames += self._end(usage)
                self._record.add(done=True)
            case Fail(message=message):
                body = message_error_body(_status_of(event), message)
                frames.append(self._emit("error", body))
                self._record.add(error=body["error"])
            case _:
                padder = self._padder
                frames.append(
                    _PING if padder is None else padder.like_delta("ping", _ping())
                )
        self._state = next_state
        return frames

    def _emit(
        self, name: str, payload: dict[str, Any], text: str | None = None
    ) -> bytes:
        """One event, padded when a filler was given (``text``: a delta's)."""
        if self._padder is not None:
            return self._padder.event(name, payload, text)
        return _event(name, payload)

    def _next(self, event: StreamEvent | Start) -> StreamState:
        next_state = TRANSITIONS.get((self._state, type(event)))
        if next_state is None:
            raise LocalProtocolError(
                f"{type(event).__name__} is not allowed in state {self._state.name}"
            )
        if isinstance(event, Delta | Finish) and event.index != 0:
            raise LocalProtocolError(
                f"{type(event).__name__} for choice {event.index!r}, but a message"
                " has one output"
            )
        return next_state

    def _open(
        self, block: str | int, content: dict[str, Any], frames: list[bytes]
    ) -> None:
        self._close(frames)
        self._index += 1
        self._block = block
        payload = {
            "type": "content_block_start",
            "index": self._index,
            "content_block": content,
        }
        frames.append(self._emit("content_block_start", payload))

    def _close(self, frames: list[bytes]) -> None:
        if self._block == "thinking":
            delta = {"type": "signature_delta", "signature": self._thinking.signature}
            payload = {
                "type": "content_block_delta",
                "index": self._index,
                "delta": delta,
            }
            frames.append(self._emit("content_block_delta", payload))
        if self._block is not None:
            payload = {"type": "content_block_stop", "index": self._index}
            frames.append(self._emit("content_block_stop", payload))
            self._block = self._template = None

    def _thought(self, text: str, frames: list[bytes]) -> None:
        if self._block != "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            self._open("thinking", block, frames)
            self._thinking = ThinkingDigest()
        self._thinking.add(text)
        delta = {"type": "thinking_delta", "thinking": text}
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        frames.append(self._emit("content_block_delta", payload, text))

    def _text(self, text: str, frames: list[bytes]) -> None:
        template = self._template
        if template is None:
            self._open("text", {"type": "text", "text": ""}, frames)
            delta = {"type": "text_delta", "text": TEXT_MARK}
            payload = {"type": _BLOCK_DELTA, "index": self._index, "delta": delta}
            template = self._template = EventTemplate(
                _BLOCK_DELTA, payload, self._padder
            )
        frames.append(template.frame(text))

    def _call(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        if fragment.name is not None or self._block != fragment.index:
            block = {
                "type": "tool_use",
                "id": fragment.id or "",
                "name": fragment.name or "",
                "input": {},
            }
            self._open(fragment.index, block, frames)
        if fragment.arguments:
            delta = {"type": "input_json_delta", "partial_json": fragment.arguments}
            payload = {
                "type": "content_block_delta",
                "index": self._index,
                "delta": delta,
            }
            arguments = fragment.arguments
            frames.append(self._emit("content_block_delta", payload, arguments))

    def _end(self, usage: Usage) -> list[bytes]:
        delta = {
            "stop_reason": stop_reason(self._reason, self._stop),
            "stop_sequence": self._stop,
        }
        counts = usage_object(usage)
        payload = {"type": "message_delta", "delta": delta, "usage": counts}
        return [
            self._emit("message_delta", payload),
            self._emit("message_stop", {"type": "message_stop"}),
        ]


def _status_of(fail: Fail) -> int:
    """The status a ``Fail`` would have had before the stream: overloaded for an
    engine that was unavailable or shutting down, else a server error."""
    if fail.code in {"engine_unavailable", "server_shutdown", "overloaded"}:
        return 529
    return 500
