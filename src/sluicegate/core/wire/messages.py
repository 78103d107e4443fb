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
The states, their legal events and when a block opens are
``blocks.BlockMachine``'s; ``outcome`` is ``classify()`` of what was written, as
for chat: finished once ``message_stop``
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

from collections.abc import Mapping
from typing import Any

from sluicegate.core.events import (
    Fail,
    Finish,
    FinishReason,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.blocks import REASONING, BlockMachine
from sluicegate.core.wire.messages_bodies import (
    ERROR_TYPES,
    ThinkingDigest,
    message_body,
    message_error_body,
    stop_reason,
    thinking_signature,
    usage_object,
)
from sluicegate.core.wire.padding import Filler, typed_event
from sluicegate.core.wire.templates import TEXT_MARK, EventTemplate

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


class MessagesStream(BlockMachine):
    """feed(event) -> Anthropic SSE frames (bytes); see the module docstring.

    A ``blocks.BlockMachine``: the states, the open content block and when the
    next one opens are decided there; this class writes Anthropic's events.

    Args:
        header: the response's shared fields (``n`` must be 1;
            ``prompt_tokens`` is the usage's ``input_tokens``).
        filler: pad every event (``blocks.BlockMachine``: an ``obfuscation``
            field that Anthropic's clients ignore); ``None`` for no padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n != 1``.
    """

    __slots__ = ("_index", "_stop", "_thinking")

    _CHOICES = "a message has one output"

    def _prepare(self, filler: Filler | None, pad_step_bytes: int) -> None:
        super()._prepare(filler, pad_step_bytes)
        self._stop: str | None = None
        self._thinking = ThinkingDigest()
        self._index = -1  # the open (or last) content block's index

    def _opening(self) -> list[bytes]:
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

    def _emit(
        self, name: str, payload: dict[str, Any], text: str | None = None
    ) -> bytes:
        """One event, padded when a filler was given (``text``: a delta's)."""
        if self._padder is not None:
            return self._padder.event(name, payload, text)
        return typed_event(name, payload)

    def _open(self, content: dict[str, Any], frames: list[bytes]) -> None:
        self._index += 1
        payload = {
            "type": "content_block_start",
            "index": self._index,
            "content_block": content,
        }
        frames.append(self._emit("content_block_start", payload))

    def _block_delta(
        self, delta: dict[str, Any], frames: list[bytes], text: str | None = None
    ) -> None:
        payload = {"type": _BLOCK_DELTA, "index": self._index, "delta": delta}
        frames.append(self._emit(_BLOCK_DELTA, payload, text))

    def _close_block(
        self, block: str | int, reason: FinishReason | None, frames: list[bytes]
    ) -> None:
        if block == REASONING:
            delta = {"type": "signature_delta", "signature": self._thinking.signature}
            self._block_delta(delta, frames)
        payload = {"type": "content_block_stop", "index": self._index}
        frames.append(self._emit("content_block_stop", payload))

    def _open_reasoning(self, frames: list[bytes]) -> None:
        self._open({"type": "thinking", "thinking": "", "signature": ""}, frames)
        self._thinking = ThinkingDigest()

    def _reasoning(self, text: str, frames: list[bytes]) -> None:
        self._thinking.add(text)
        self._block_delta({"type": "thinking_delta", "thinking": text}, frames, text)

    def _open_text(self, frames: list[bytes]) -> None:
        self._open({"type": "text", "text": ""}, frames)
        delta = {"type": "text_delta", "text": TEXT_MARK}
        payload = {"type": _BLOCK_DELTA, "index": self._index, "delta": delta}
        self._text_frame = EventTemplate(_BLOCK_DELTA, payload, self._padder).frame

    def _open_call(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        block = {
            "type": "tool_use",
            "id": fragment.id or "",
            "name": fragment.name or "",
            "input": {},
        }
        self._open(block, frames)

    def _arguments(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        arguments = fragment.arguments
        delta = {"type": "input_json_delta", "partial_json": arguments}
        self._block_delta(delta, frames, arguments)

    def _finish(self, event: Finish) -> list[bytes]:
        frames = super()._finish(event)
        self._stop = event.stop_sequence
        return frames

    def _end(self, usage: Usage) -> list[bytes]:
        delta = {
            "stop_reason": stop_reason(self._finish_reasons[0], self._stop),
            "stop_sequence": self._stop,
        }
        counts = usage_object(usage)
        payload = {"type": "message_delta", "delta": delta, "usage": counts}
        return [
            self._emit("message_delta", payload),
            self._emit("message_stop", {"type": "message_stop"}),
        ]

    def _fail(self, event: Fail) -> tuple[list[bytes], Mapping[str, Any]]:
        body = message_error_body(_status_of(event), event.message)
        return [self._emit("error", body)], body["error"]

    def _heartbeat(self) -> bytes:
        padder = self._padder
        return _PING if padder is None else padder.like_delta("ping", _ping())


def _status_of(fail: Fail) -> int:
    """The status a ``Fail`` would have had before the stream: overloaded for an
    engine that was unavailable or shutting down, else a server error."""
    if fail.code in {"engine_unavailable", "server_shutdown", "overloaded"}:
        return 529
    return 500
