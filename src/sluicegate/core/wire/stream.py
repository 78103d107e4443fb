"""StreamMachine: the per-response state machine that writes SSE frames and ends them.

The server tells the machine what happened (``start()``, then ``Delta``,
``Finish``, ``End``, ``Fail`` or ``Heartbeat`` events) and writes the bytes it
returns, in order. Which frames end a stream (finish chunks, usage chunk, error
event, ``[DONE]`` or not) is decided here and nowhere else, by ``TRANSITIONS``:

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

A content chunk of text alone comes from a template (``templates.ChoiceFrames``):
the JSON of its text between its choice's prebuilt bytes. The finish chunk of a
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
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    End,
    Fail,
    Finish,
    FinishReason,
    Heartbeat,
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
from sluicegate.core.wire.padding import (
    MIN_STEP_BYTES,
    Filler,
    FramePadder,
    frame_floor,
)
from sluicegate.core.wire.sse import DONE, encode_comment, encode_event
from sluicegate.core.wire.templates import ChoiceFrames
from sluicegate.core.wire.written import WriteRecord

__all__ = [
    "TRANSITIONS",
    "Endpoint",
    "ResponseHeader",
    "Start",
    "StreamMachine",
    "StreamState",
]


class StreamState(StrEnum):
    """Where one streamed response is."""

    NEW = "new"
    """Headers may be out; ``start()`` not called yet."""
    STREAMING = "streaming"
    """At least one choice has not finished."""
    AWAITING_END = "awaiting_end"
    """Every choice has its finish chunk; ``End`` closes the stream."""
    FINISHED = "finished"
    """Terminal: ``[DONE]`` was written."""
    ERRORED = "errored"
    """Terminal: the in-band error event was written (no ``[DONE]``)."""


@dataclass(frozen=True, slots=True)
class Start:
    """The transition ``StreamMachine.start()`` makes; a key of ``TRANSITIONS``."""


TRANSITIONS: Mapping[tuple[StreamState, type[object]], StreamState] = {
    (StreamState.NEW, Start): StreamState.STREAMING,
    (StreamState.NEW, Heartbeat): StreamState.NEW,
    (StreamState.NEW, Fail): StreamState.ERRORED,
    (StreamState.STREAMING, Delta): StreamState.STREAMING,
    (StreamState.STREAMING, Finish): StreamState.STREAMING,
    (StreamState.STREAMING, Heartbeat): StreamState.STREAMING,
    (StreamState.STREAMING, Fail): StreamState.ERRORED,
    (StreamState.AWAITING_END, End): StreamState.FINISHED,
    (StreamState.AWAITING_END, Heartbeat): StreamState.AWAITING_END,
    (StreamState.AWAITING_END, Fail): StreamState.ERRORED,
}
"""(state, event type) -> next state. ``Finish`` of the last open choice then moves
``STREAMING`` to ``AWAITING_END``."""

_END_STATES: Mapping[StreamState, EndState] = {
    StreamState.FINISHED: EndState.FINISHED,
    StreamState.ERRORED: EndState.ERRORED,
}

# The state where a ``Delta`` is legal, which it stays in: the per-token path in
# ``StreamMachine.feed`` checks it by identity instead of hashing the pair.
(_DELTA_STATE,) = {
    state
    for (state, kind), new in TRANSITIONS.items()
    if kind is Delta and new is state
}
_HEARTBEAT = encode_comment()
_CHOICE_EVENTS = (Delta, Finish)


class StreamMachine:
    """feed(event) -> SSE frames (bytes). The end-of-stream sequence is decided here.

    Args:
        header: the fields every chunk of this response shares, ``n`` and
            ``include_usage`` included.
        filler: pad every frame with its characters (``padding.py``); ``None``
            sends frames unpadded.
        pad_step_bytes: the padding ladder's first step (bytes, a power of two).

    Raises:
        ValueError: ``header.n < 1``.
    """

    __slots__ = (
        "_finish_reasons",
        "_header",
        "_padder",
        "_record",
        "_state",
        "_text_frames",
    )

    def __init__(
        self,
        header: ResponseHeader,
        filler: Filler | None = None,
        pad_step_bytes: int = MIN_STEP_BYTES,
    ) -> None:
        if header.n < 1:
            raise ValueError(f"a response has at least one choice, got n={header.n!r}")
        self._header = header
        self._state = StreamState.NEW
        self._finish_reasons: list[FinishReason | None] = [None] * header.n
        # Per open choice, its content frame around the JSON of the text: a
        # content chunk then costs one encode of its text, not of the whole chunk.
        self._padder: FramePadder | None = None
        if filler is not None:
            self._padder = FramePadder(filler, frame_floor(header), pad_step_bytes)
        self._text_frames = ChoiceFrames(header, self._padder)
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
        return _END_STATES.get(self._state)

    @property
    def outcome(self) -> EndState:
        """The stream's end state, from what was written (``WriteRecord.outcome``)."""
        return self._record.outcome(self._header.n)

    def wrote(self) -> None:
        """Report that every frame returned so far was written to the connection
        (``WriteRecord.wrote``: only closing frames move ``outcome``).

        Raises:
            LocalProtocolError: after ``write_failed()``; nothing changes.
        """
        self._record.wrote()

    def write_failed(self) -> None:
        """Report that writing stopped before the frames since the last ``wrote()``
        went out. Idempotent. ``feed()`` may still be called (its frames count for
        nothing); ``outcome`` is final from here on."""
        self._record.write_failed()

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """Each choice's finish reason, by index (``None`` while it is open)."""
        return tuple(self._finish_reasons)

    def start(self) -> list[bytes]:
        """Frames to send right after the headers (chat: one role chunk per choice).

        Returns:
            Chat: ``n`` chunks with ``delta: {"role": "assistant"}``, one per
            choice, in index order. Completions: ``[]``.

        Raises:
            LocalProtocolError: not in state ``NEW``.
        """
        next_state = self._next_state(Start())
        frames: list[bytes] = []
        header = self._header
        if header.endpoint is Endpoint.CHAT:
            usage = None
            if header.continuous_usage:
                usage = Usage(header.prompt_tokens, 0)
            role = {"role": "assistant"}
            frames = [
                self._frame(chat_chunk(header, index, role, usage=usage))
                for index in range(header.n)
            ]
        self._state = next_state
        return frames

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
            and self._state is _DELTA_STATE
            and event.logprobs is None
            and event.usage is None
            and event.parts is None
        ):
            # Once per token: the text's JSON between the choice's prebuilt bytes
            # (text-only deltas of an open choice; ``_next_state`` raises for a
            # closed or unknown one and ``_frames`` builds the others whole).
            frame = self._text_frames.frame(event.index, event.text)
            if frame is not None:
                return [frame] if frame else []
        next_state = self._next_state(event)
        frames = self._frames(event)
        if isinstance(event, Finish):
            self._finish_reasons[event.index] = event.finish_reason
            self._text_frames.close(event.index)
            if None not in self._finish_reasons:
                next_state = StreamState.AWAITING_END
            self._record.add(finishes=1)
        elif isinstance(event, End):
            self._record.add(done=True)
        elif isinstance(event, Fail):
            payload = error_payload(event.message, event.type, None, event.code)
            self._record.add(error=payload["error"])
        self._state = next_state
        return frames

    def _next_state(self, event: StreamEvent | Start) -> StreamState:
        next_state = TRANSITIONS.get((self._state, type(event)))
        if next_state is None:
            raise LocalProtocolError(
                f"{type(event).__name__} is not allowed in state {self._state.name}"
            )
        if isinstance(event, _CHOICE_EVENTS):
            if not 0 <= event.index < self._header.n:
                raise LocalProtocolError(
                    f"{type(event).__name__} for choice {event.index!r}, but the "
                    f"response has n={self._header.n}"
                )
            reason = self._finish_reasons[event.index]
            if reason is not None:
                raise LocalProtocolError(
                    f"{type(event).__name__} for choice {event.index}, which already "
                    f"finished with {reason.value!r}"
                )
        return next_state

    def _frames(self, event: StreamEvent) -> list[bytes]:
        header = self._header
        chat = header.endpoint is Endpoint.CHAT
        match event:
            case Delta(
                index=index, text=text, logprobs=logprobs, usage=usage, parts=parts
            ):
                # Only deltas that the prebuilt frames in ``feed`` do not cover.
                # Parts (tool calls, reasoning) exist on chat chunks only.
                if not text and not (chat and parts):
                    return []
                if chat:
                    delta = chat_delta(text, parts)
                    chunk = chat_chunk(
                        header, index, delta, logprobs=logprobs, usage=usage
                    )
                else:
                    chunk = completion_chunk(
                        header, index, text, logprobs=logprobs, usage=usage
                    )
                return [self._frame(chunk)]
            case Finish(index=index, finish_reason=reason, usage=usage):
                if chat:
                    chunk = chat_chunk(header, index, {}, reason, usage=usage)
                else:
                    chunk = completion_chunk(header, index, "", reason, usage=usage)
                if event.stop_sequence is not None:  # vLLM's name for it
                    chunk["choices"][0]["stop_reason"] = event.stop_sequence
                return [self._frame(chunk)]
            case End(usage=usage):
                if header.include_usage:
                    return [self._frame(usage_chunk(header, usage)), DONE]
                return [DONE]
            case Fail(message=message, type=type_, code=code):
                return [self._frame(error_payload(message, type_, None, code))]
            case _:
                # TRANSITIONS admits no other event type.
                assert isinstance(event, Heartbeat)
                if self._padder is not None:
                    return [self._padder.comment()]
                return [_HEARTBEAT]

    def _frame(self, payload: dict[str, Any]) -> bytes:
        if self._padder is not None:
            return self._padder.frame(payload)
        return _frame(payload)


def _frame(payload: object) -> bytes:
    return encode_event(dumps(payload))
