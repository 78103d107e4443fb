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

import base64
import hashlib
from typing import Any

import orjson

from sluicegate.core.chunks import ResponseHeader, dumps
from sluicegate.core.endstate import EndState, classify
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
from sluicegate.core.padding import MIN_STEP_BYTES, EventPadder, Filler
from sluicegate.core.stream import TRANSITIONS, Closing, Start, StreamState

__all__ = [
    "ERROR_TYPES",
    "MessagesStream",
    "message_body",
    "message_error_body",
    "stop_reason",
    "thinking_signature",
    "usage_object",
]

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
"""HTTP status -> Anthropic's error ``type``; any other status is ``api_error``
(a 4xx not listed: ``invalid_request_error``)."""

_STOP_REASONS = {
    FinishReason.LENGTH: "max_tokens",
    FinishReason.TOOL_CALLS: "tool_use",
}
_PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def usage_object(usage: Usage) -> dict[str, int]:
    """Anthropic's ``usage``: ``{input_tokens, cache_creation_input_tokens,
    cache_read_input_tokens, output_tokens}`` (tokens).

    ``input_tokens`` counts the prompt tokens not read from a cache, as
    Anthropic counts them (the prompt is the sum of the three input fields);
    ``cache_read_input_tokens`` is ``usage.cached_tokens``;
    ``cache_creation_input_tokens`` is 0 (no request writes a cache
    breakpoint here).

    Spec: Anthropic API reference, "Messages", ``usage``.
    """
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


def stop_reason(reason: FinishReason | None, stop_sequence: str | None) -> str | None:
    """Anthropic's ``stop_reason`` for a finish: ``end_turn``, ``stop_sequence``
    (a stop string matched), ``max_tokens`` or ``tool_use``; ``None`` for none."""
    if reason is None:
        return None
    if reason is FinishReason.STOP:
        return "end_turn" if stop_sequence is None else "stop_sequence"
    return _STOP_REASONS[reason]


def thinking_signature(text: str) -> str:
    """The ``signature`` of a thinking block whose text is ``text``: the
    base64 of its UTF-8 SHA-256 digest, as the streamed and the non-streamed
    answers give it (``_Thinking`` computes it piece by piece)."""
    return _Thinking(text).signature


class _Thinking:
    """A thinking block's text so far, digested as it streams."""

    __slots__ = ("_digest",)

    def __init__(self, text: str = "") -> None:
        self._digest = hashlib.sha256(text.encode())

    def add(self, text: str) -> None:
        self._digest.update(text.encode())

    @property
    def signature(self) -> str:
        return base64.b64encode(self._digest.digest()).decode()


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
        "_gone",
        "_header",
        "_index",
        "_padder",
        "_pending",
        "_reason",
        "_state",
        "_stop",
        "_thinking",
        "_written",
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
        self._thinking = _Thinking()
        self._index = -1  # the open (or last) content block's index
        self._pending = Closing()
        self._written = Closing()
        self._gone = False

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
                self._pending = self._pending.plus(Closing(finishes=1))
            case End(usage=usage):
                frames += self._end(usage)
                self._pending = self._pending.plus(Closing(done=True))
            case Fail(message=message):
                body = message_error_body(_status_of(event), message)
                frames.append(self._emit("error", body))
                self._pending = self._pending.plus(Closing(error=body["error"]))
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
            self._block = None

    def _thought(self, text: str, frames: list[bytes]) -> None:
        if self._block != "thinking":
            block = {"type": "thinking", "thinking": "", "signature": ""}
            self._open("thinking", block, frames)
            self._thinking = _Thinking()
        self._thinking.add(text)
        delta = {"type": "thinking_delta", "thinking": text}
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        frames.append(self._emit("content_block_delta", payload, text))

    def _text(self, text: str, frames: list[bytes]) -> None:
        if self._block != "text":
            self._open("text", {"type": "text", "text": ""}, frames)
        delta = {"type": "text_delta", "text": text}
        payload = {"type": "content_block_delta", "index": self._index, "delta": delta}
        frames.append(self._emit("content_block_delta", payload, text))

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


def message_body(header: ResponseHeader, whole: Any) -> dict[str, Any]:
    """The non-streamed ``message`` object of a finished response.

    Args:
        header: id and model.
        whole: a ``wire.Whole``: text, finish reason, usage, calls, stop string,
            reasoning.

    Returns:
        ``{id, type: "message", role: "assistant", model, content: [thinking
        block {thinking, signature} (when there is reasoning), text block
        (when there is text), tool_use blocks with ``input`` the parsed
        arguments], stop_reason, stop_sequence, usage: {input_tokens,
        output_tokens}}``.

    Spec: Anthropic API reference, "Messages", the response.
    """
    content: list[dict[str, Any]] = []
    if whole.reasoning:
        signature = thinking_signature(whole.reasoning)
        thinking = {"type": "thinking", "thinking": whole.reasoning}
        content.append({**thinking, "signature": signature})
    if whole.text:
        content.append({"type": "text", "text": whole.text})
    for call in whole.tool_calls:
        content.append(
            {
                "type": "tool_use",
                "id": call.id or "",
                "name": call.name or "",
                "input": _input(call.arguments),
            }
        )
    return {
        "id": header.id,
        "type": "message",
        "role": "assistant",
        "model": header.model,
        "content": content,
        "stop_reason": stop_reason(whole.finish_reason, whole.stop_sequence),
        "stop_sequence": whole.stop_sequence,
        "usage": usage_object(whole.usage),
    }


def _input(arguments: str) -> Any:
    """A call's arguments as the ``input`` object (``{}`` for none)."""
    if not arguments:
        return {}
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}


def message_error_body(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}`` for HTTP ``status``
    (``ERROR_TYPES``; ``api_error`` for a 5xx not listed)."""
    default = "invalid_request_error" if 400 <= status < 500 else "api_error"
    kind = ERROR_TYPES.get(status, default)
    return {"type": "error", "error": {"type": kind, "message": message}}
