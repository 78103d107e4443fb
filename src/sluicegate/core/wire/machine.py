"""The stream machines' one base: the states, the transition table, the bookkeeping.

Every wire API's stream machine (``stream.StreamMachine`` for chat and
completions, ``responses.ResponsesStream``, ``messages.MessagesStream``) is a
``WireMachine``: it moves by ``TRANSITIONS`` (drawn with chat's frames in
``stream.py``), keeps each choice's finish reason and one
``written.WriteRecord``, and answers the server's questions (``state``,
``end_state``, ``outcome``, ``wrote()``, ``write_failed()``) here. A machine
says only which frames each step writes (``_opening``, ``_delta``, ``_finish``,
``_end``, ``_fail``, ``_heartbeat``); what a step does to the state and the
record is decided once, in ``WireMachine._step``. An illegal step (a pair not in
the table, a ``Delta`` or ``Finish`` for an index outside ``0..n-1`` or for a
choice that has finished) raises ``LocalProtocolError`` and changes nothing.

``BlockMachine`` is the base of the two APIs of one output written as blocks
that open, grow and close (the Responses API's output items, the Messages API's
content blocks): which block is open, when a delta opens the next one (closing
the open one first), and its text deltas' fast path. Reasoning opens a reasoning
block unless one is open; text a text block unless one is open; a tool call's
fragment a call block when it names the call or another block is open.

Spec: docs/DESIGN.md, "End states"; ARCHITECTURE.md, "The stream state machine".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

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
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.padding import MIN_STEP_BYTES, EventPadder, Filler
from sluicegate.core.wire.written import WriteRecord

__all__ = [
    "DELTA_STATE",
    "TRANSITIONS",
    "BlockMachine",
    "Start",
    "StreamState",
    "WireMachine",
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
    """Terminal: the terminator (``[DONE]``, the terminal event) was written."""
    ERRORED = "errored"
    """Terminal: the in-band error event was written (no terminator)."""


@dataclass(frozen=True, slots=True)
class Start:
    """The transition ``start()`` makes; a key of ``TRANSITIONS``."""


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

# The state where a ``Delta`` is legal, which it stays in: a machine's per-token
# path checks it by identity instead of hashing the pair.
(DELTA_STATE,) = {
    state
    for (state, kind), new in TRANSITIONS.items()
    if kind is Delta and new is state
}
_CHOICE_EVENTS = (Delta, Finish)


class WireMachine(ABC):
    """feed(event) -> frames (bytes): the states and records every API shares.

    Args:
        header: the response's shared fields (``n`` choices).

    A subclass's ``feed`` takes its per-token fast path, if any, and hands every
    other event to ``_step``.
    """

    __slots__ = ("_finish_reasons", "_header", "_record", "_state")

    _CHOICES: ClassVar[str] = "the response has n={n}"
    """How a wrong choice index's error ends (``n``: the response's)."""

    def __init__(self, header: ResponseHeader) -> None:
        self._header = header
        self._state = StreamState.NEW
        self._finish_reasons: list[FinishReason | None] = [None] * header.n
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

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """Each choice's finish reason, by index (``None`` while it is open)."""
        return tuple(self._finish_reasons)

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

    def start(self) -> list[bytes]:
        """The frames to send right after the headers (the API's ``_opening``).

        Raises:
            LocalProtocolError: not in state ``NEW``.
        """
        next_state = self._next(Start())
        frames = self._opening()
        self._state = next_state
        return frames

    def _step(self, event: StreamEvent) -> list[bytes]:
        """``feed(event)`` but for a fast path: the frames, then the bookkeeping."""
        next_state = self._next(event)
        match event:
            case Delta():
                frames = self._delta(event)
            case Finish(index=index, finish_reason=reason):
                frames = self._finish(event)
                reasons = self._finish_reasons
                reasons[index] = reason
                if None not in reasons:
                    next_state = StreamState.AWAITING_END
                self._record.add(finishes=1)
            case End(usage=usage):
                frames = self._end(usage)
                self._record.add(done=True)
            case Fail():
                frames, error = self._fail(event)
                self._record.add(error=error)
            case _:
                # TRANSITIONS admits no other event type.
                assert isinstance(event, Heartbeat)
                frames = [self._heartbeat()]
        self._state = next_state
        return frames

    def _next(self, event: StreamEvent | Start) -> StreamState:
        next_state = TRANSITIONS.get((self._state, type(event)))
        if next_state is None:
            raise LocalProtocolError(
                f"{type(event).__name__} is not allowed in state {self._state.name}"
            )
        if isinstance(event, _CHOICE_EVENTS):
            reasons = self._finish_reasons
            if not 0 <= event.index < len(reasons):
                choices = self._CHOICES.format(n=len(reasons))
                raise LocalProtocolError(
                    f"{type(event).__name__} for choice {event.index!r}, but {choices}"
                )
            reason = reasons[event.index]
            if reason is not None:
                raise LocalProtocolError(
                    f"{type(event).__name__} for choice {event.index}, which already "
                    f"finished with {reason.value!r}"
                )
        return next_state

    @abstractmethod
    def _opening(self) -> list[bytes]:
        """The frames of ``start()``."""

    @abstractmethod
    def _delta(self, event: Delta) -> list[bytes]:
        """The frames of a ``Delta`` the fast path did not write."""

    @abstractmethod
    def _finish(self, event: Finish) -> list[bytes]:
        """The frames of a choice's ``Finish`` (its reason not recorded yet)."""

    @abstractmethod
    def _end(self, usage: Usage) -> list[bytes]:
        """The closing frames of a stream whose choices have all finished."""

    @abstractmethod
    def _fail(self, event: Fail) -> tuple[list[bytes], Mapping[str, Any]]:
        """The error event's frames, and the error object they carry."""

    @abstractmethod
    def _heartbeat(self) -> bytes:
        """One heartbeat frame."""


REASONING = "reasoning"
"""``BlockMachine``'s open block: a reasoning block."""
TEXT = "text"
"""``BlockMachine``'s open block: a text block (else a call's index)."""


def _closed(text: str) -> None:
    """The text frame while no text block is open: none."""
    return None


class BlockMachine(WireMachine):
    """A ``WireMachine`` of one output written as blocks that open, grow, close.

    Args:
        header: the response's shared fields (``n`` must be 1).
        filler: pad every event (``padding.EventPadder``, the ``obfuscation``
            field); ``None`` for no padding.
        pad_step_bytes: the padding ladder's first step (bytes).

    Raises:
        ValueError: ``header.n != 1``.

    A subclass writes the frames of a block's opening (``_open_reasoning``,
    ``_open_text``, ``_open_call``), growth (``_reasoning``, ``_arguments``; text
    through ``_text_frame``, which ``_open_text`` sets) and closing
    (``_close_block``).
    """

    __slots__ = ("_block", "_padder", "_text_frame")

    _CHOICES = "a response has one output"

    def __init__(
        self,
        header: ResponseHeader,
        filler: Filler | None = None,
        pad_step_bytes: int = MIN_STEP_BYTES,
    ) -> None:
        if header.n != 1:
            raise ValueError(f"{self._CHOICES}, got n={header.n!r}")
        super().__init__(header)
        self._padder = (
            EventPadder(filler, pad_step_bytes) if filler is not None else None
        )
        self._block: str | int | None = None  # REASONING, TEXT or a call's index
        # The open text block's delta of some text (bytes), else ``None``.
        self._text_frame: Callable[[str], bytes | None] = _closed

    def feed(self, event: StreamEvent) -> list[bytes]:
        """Take one event; the frames to write now, in order (the API's module
        docstring).

        Raises:
            LocalProtocolError: the event is not allowed in this state, or names
                a choice other than 0; nothing changes.
        """
        if (
            type(event) is Delta
            and self._state is DELTA_STATE
            and event.parts is None
            and event.index == 0
            and event.text
        ):
            # Once per token: text added to the open text block, from its template.
            frame = self._text_frame(event.text)
            if frame is not None:
                return [frame]
        return self._step(event)

    def _delta(self, event: Delta) -> list[bytes]:
        frames: list[bytes] = []
        text, parts = event.text, event.parts
        if parts is not None and parts.reasoning:
            if self._block != REASONING:
                self._switch(REASONING, frames)
                self._open_reasoning(frames)
            self._reasoning(parts.reasoning, frames)
        if text:
            if self._block != TEXT:
                self._switch(TEXT, frames)
                self._open_text(frames)
            frame = self._text_frame(text)
            assert frame is not None  # ``_open_text`` set the text block's
            frames.append(frame)
        if parts is not None:
            for fragment in parts.tool_calls:
                if fragment.name is not None or self._block != fragment.index:
                    self._switch(fragment.index, frames)
                    self._open_call(fragment, frames)
                if fragment.arguments:
                    self._arguments(fragment, frames)
        return frames

    def _finish(self, event: Finish) -> list[bytes]:
        frames: list[bytes] = []
        self._close(event.finish_reason, frames)
        return frames

    def _switch(self, block: str | int, frames: list[bytes]) -> None:
        """Close the open block; ``block`` opens next."""
        self._close(None, frames)
        self._block = block

    def _close(self, reason: FinishReason | None, frames: list[bytes]) -> None:
        block = self._block
        if block is not None:
            # Closed before its frames are built: a frame that cannot be
            # encoded (a lone surrogate in the block's text) leaves no block open.
            self._block = None
            self._text_frame = _closed
            self._close_block(block, reason, frames)

    @abstractmethod
    def _open_reasoning(self, frames: list[bytes]) -> None:
        """Append the frames that open a reasoning block."""

    @abstractmethod
    def _reasoning(self, text: str, frames: list[bytes]) -> None:
        """Append the frames of reasoning ``text`` in the open reasoning block."""

    @abstractmethod
    def _open_text(self, frames: list[bytes]) -> None:
        """Append the frames that open a text block; set ``_text_frame``."""

    @abstractmethod
    def _open_call(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        """Append the frames that open the block of ``fragment``'s call."""

    @abstractmethod
    def _arguments(self, fragment: ToolCallFragment, frames: list[bytes]) -> None:
        """Append the frames of ``fragment``'s non-empty arguments."""

    @abstractmethod
    def _close_block(
        self, block: str | int, reason: FinishReason | None, frames: list[bytes]
    ) -> None:
        """Append the frames that close ``block``, the open block (``reason``:
        the output's finish when it closes the output, else ``None``)."""
