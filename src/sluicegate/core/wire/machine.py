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

The machines of the APIs of one output written as blocks (Responses, Messages)
share more: ``blocks.BlockMachine``.

Spec: docs/DESIGN.md, "End states"; ARCHITECTURE.md, "The stream state machine".
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
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
    Usage,
)
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.padding import MIN_STEP_BYTES, Filler
from sluicegate.core.wire.written import WriteRecord

__all__ = [
    "DELTA_STATE",
    "TRANSITIONS",
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
        filler: pad every frame with its characters (``padding.py``); ``None``
            sends frames unpadded.
        pad_step_bytes: the padding ladder's first step (bytes, a power of two).

    Raises:
        ValueError: ``header.n < 1``, or ``header.n != 1`` for an API of one
            output (``_ONE_OUTPUT``).

    A subclass sets up its padding and its own state in ``_prepare``; its
    ``feed`` takes its per-token fast path, if any, and hands every other event
    to ``_step``.
    """

    __slots__ = ("_finish_reasons", "_header", "_record", "_state")

    _CHOICES: ClassVar[str] = "the response has n={n}"
    """How a wrong choice index's error ends (``n``: the response's)."""
    _ONE_OUTPUT: ClassVar[bool] = False
    """Whether ``header.n`` must be 1 (else at least 1)."""

    def __init__(
        self,
        header: ResponseHeader,
        filler: Filler | None = None,
        pad_step_bytes: int = MIN_STEP_BYTES,
    ) -> None:
        if header.n < 1 or (self._ONE_OUTPUT and header.n != 1):
            rule = "a response has at least one choice"
            if self._ONE_OUTPUT:
                rule = self._CHOICES
            raise ValueError(f"{rule}, got n={header.n!r}")
        self._header = header
        self._state = StreamState.NEW
        self._finish_reasons: list[FinishReason | None] = [None] * header.n
        self._record = WriteRecord()
        self._prepare(filler, pad_step_bytes)

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
    def _prepare(self, filler: Filler | None, pad_step_bytes: int) -> None:
        """Set up the padding and the API's own state (once, from ``__init__``)."""

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
