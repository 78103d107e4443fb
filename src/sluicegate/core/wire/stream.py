"""StreamMachine: the per-response state machine that writes SSE frames and ends them.

The server tells the machine what happened (``start()``, then ``Delta``,
``Finish``, ``End``, ``Fail`` or ``Heartbeat`` events) and writes the bytes it
returns, in order. Which frames end a stream (finish chunks, usage chunk, error
event, ``[DONE]`` or not) is decided here and nowhere else, by ``TRANSITIONS``
(``machine.py``: the states, the table and the write record every API's machine
shares):

::

    state         event        next state
    NEW           start()      STREAMING       chat: one role chunk per choice
    NEW           Heartbeat    NEW             ": keep-alive"
    NEW           Fail         ERRORED         error event, no [DONE]
    STREAMING     Delta        STREAMING       content chunk ("" sends nothing)
    STREAMING     Finish       STREAMING       finish chunk of that choice;
                                               AWAITING_END after the last choice
    STREAMING     Heartbeat    STREAMING
    STREAMING     Fail         ERRORED
    AWAITING_END  End          FINISHED        usage chunk (include_usage), [DONE]
    AWAITING_END  Heartbeat    AWAITING_END
    AWAITING_END  Fail         ERRORED

Any other pair raises ``LocalProtocolError`` naming both, and changes nothing. So
does a ``Delta`` or ``Finish`` for an index outside ``0..n-1``, a ``Delta`` for a
choice that has finished, and a second ``Finish`` for the same choice.

The server also reports what became of the frames (h11's ``send_failed()``):
``wrote()`` when every frame returned so far reached the connection,
``write_failed()`` when writing stopped first (the connection broke, the client
left, or the server gave up on a slow client). From those reports alone,
``outcome`` is the stream's ``EndState``: ``classify()`` (``endstate.py``) of the
frames written (``written.WriteRecord``), the same rule the client applies to
the bytes it received, so the server's ledger and the client agree.

A content chunk of text alone, with or without a usage (continuous usage), comes
from a template (``templates.ChoiceFrames``): the JSON of its text (and the
usage's counts) between its choice's prebuilt bytes. The finish chunk of a
choice that a stop string ended names it in ``stop_reason`` (vLLM's extension,
which OpenAI's clients ignore): a gateway in front of this server reads it as
the Messages API's ``stop_sequence``.

Frames are ``bytes``: each one complete SSE event (one compact JSON object on one
``data:`` line, then a blank line), a comment, or ``data: [DONE]``. Given a
``Filler``, the machine pads every frame but ``[DONE]`` (``padding.py``): each
JSON object gets an ``obfuscation`` field last, and heartbeats the size of a
one-token frame.

Spec: OpenAI API reference, "The chat completion chunk object" and "Create chat
completion" (``stream``, ``stream_options``); docs/DESIGN.md, "The wire" and
"End states".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluicegate.core.events import (
    Delta,
    Fail,
    Finish,
    StreamEvent,
    Usage,
)
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    chat_delta,
    completion_chunk,
    dumps,
    error_payload,
    usage_chunk,
)
from sluicegate.core.wire.machine import (
    DELTA_STATE,
    TRANSITIONS,
    Start,
    StreamState,
    WireMachine,
)
from sluicegate.core.wire.padding import (
    Filler,
    FramePadder,
    frame_floor,
)
from sluicegate.core.wire.sse import DONE, encode_comment, encode_event
from sluicegate.core.wire.templates import ChoiceFrames

__all__ = [
    "TRANSITIONS",
    "Endpoint",
    "ResponseHeader",
    "Start",
    "StreamMachine",
    "StreamState",
]


_HEARTBEAT = encode_comment()


class StreamMachine(WireMachine):
    """feed(event) -> SSE frames (bytes). The end-of-stream sequence is decided here.

    The states, their legal events and the write reports are
    ``machine.WireMachine``'s; this class writes OpenAI's chunks for them.
    ``start()`` returns, on chat, ``n`` chunks with ``delta: {"role":
    "assistant"}``, one per choice in index order; on completions ``[]``.

    Args:
        header: the fields every chunk of this response shares, ``n`` and
            ``include_usage`` included.
        filler: pad every frame with its characters (``padding.py``); ``None``
            sends frames unpadded.
        pad_step_bytes: the padding ladder's first step (bytes, a power of two).

    Raises:
        ValueError: ``header.n < 1``.
    """

    __slots__ = ("_padder", "_text_frames")

    def _prepare(self, filler: Filler | None, pad_step_bytes: int) -> None:
        header = self._header
        # Per open choice, its content frame around the JSON of the text: a
        # content chunk then costs one encode of its text, not of the whole chunk.
        self._padder: FramePadder | None = None
        if filler is not None:
            self._padder = FramePadder(filler, frame_floor(header), pad_step_bytes)
        self._text_frames = ChoiceFrames(header, self._padder)

    def feed(self, event: StreamEvent) -> list[bytes]:
        """Take one event and return the frames to write now, in order.

        Args:
            event: ``Delta`` (new text of one choice), ``Finish`` (one choice
                ended), ``End`` (all choices ended; carries usage), ``Fail`` (an
                error after the first byte) or ``Heartbeat``.

        Returns:
            ``Delta``: one content chunk (with the event's logprobs and usage,
            when set; chat: its parts as ``chunks.chat_delta`` shapes them), or
            ``[]`` when there is nothing to send (empty text, and on chat no
            parts either). ``Finish``: that
            choice's chunk with ``finish_reason`` (chat ``delta: {}``, completions
            ``text: ""``). ``End``: the usage chunk if ``include_usage``, then
            ``data: [DONE]``. ``Fail``: one ``data: {"error": {...}}`` event and no
            ``[DONE]``. ``Heartbeat``: ``: keep-alive``.

        Raises:
            LocalProtocolError: the event is not allowed in this state (see
                ``TRANSITIONS``) or names a wrong choice; nothing changes.
            TypeError: ``Delta`` text JSON cannot encode (a lone surrogate);
                nothing changes.
        """
        if (
            type(event) is Delta
            and self._state is DELTA_STATE
            and event.logprobs is None
            and event.parts is None
        ):
            # Once per token: the text's JSON (and the usage's counts) between
            # the choice's prebuilt bytes (text-only deltas of an open choice;
            # ``_next`` raises for a closed or unknown one and ``_delta`` builds
            # the others whole).
            usage = event.usage
            if usage is None:
                frame = self._text_frames.frame(event.index, event.text)
            else:
                frame = self._text_frames.usage_frame(event.index, event.text, usage)
            if frame is not None:
                return [frame] if frame else []
        return self._step(event)

    def _opening(self) -> list[bytes]:
        header = self._header
        if header.endpoint is not Endpoint.CHAT:
            return []
        usage = None
        if header.continuous_usage:
            usage = Usage(header.prompt_tokens, 0, header.cached_tokens)
        role = {"role": "assistant"}
        return [
            self._frame(chat_chunk(header, index, role, usage=usage))
            for index in range(header.n)
        ]

    def _delta(self, event: Delta) -> list[bytes]:
        # Only deltas that the prebuilt frames in ``feed`` do not cover. Parts
        # (tool calls, reasoning) exist on chat chunks only.
        header = self._header
        chat = header.endpoint is Endpoint.CHAT
        text, parts, index = event.text, event.parts, event.index
        if not text and not (chat and parts):
            return []
        logprobs, usage = event.logprobs, event.usage
        if chat:
            delta = chat_delta(text, parts)
            chunk = chat_chunk(header, index, delta, logprobs=logprobs, usage=usage)
        else:
            chunk = completion_chunk(
                header, index, text, logprobs=logprobs, usage=usage
            )
        return [self._frame(chunk)]

    def _finish(self, event: Finish) -> list[bytes]:
        header, index = self._header, event.index
        reason, usage = event.finish_reason, event.usage
        if header.endpoint is Endpoint.CHAT:
            chunk = chat_chunk(header, index, {}, reason, usage=usage)
        else:
            chunk = completion_chunk(header, index, "", reason, usage=usage)
        if event.stop_sequence is not None:  # vLLM's name for it
            chunk["choices"][0]["stop_reason"] = event.stop_sequence
        frame = self._frame(chunk)  # first: a stop string JSON cannot encode raises
        self._text_frames.close(index)
        return [frame]

    def _end(self, usage: Usage) -> list[bytes]:
        header = self._header
        if header.include_usage:
            return [self._frame(usage_chunk(header, usage)), DONE]
        return [DONE]

    def _fail(self, event: Fail) -> tuple[list[bytes], Mapping[str, Any]]:
        payload = error_payload(event.message, event.type, None, event.code)
        return [self._frame(payload)], payload["error"]

    def _heartbeat(self) -> bytes:
        if self._padder is not None:
            return self._padder.comment()
        return _HEARTBEAT

    def _frame(self, payload: dict[str, Any]) -> bytes:
        if self._padder is not None:
            return self._padder.frame(payload)
        return _frame(payload)


def _frame(payload: object) -> bytes:
    return encode_event(dumps(payload))
