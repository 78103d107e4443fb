"""BlockMachine: the stream machine of an API whose one output is written as blocks.

The base of the two APIs of one output written as blocks that open, grow and
close (the Responses API's output items, the Messages API's content blocks), over
``machine.WireMachine``: which block is open, when a delta opens the next one
(closing the open one first), and its text deltas' fast path. Reasoning opens a
reasoning block unless one is open; text a text block unless one is open; a tool
call's fragment a call block when it names the call or another block is open.

A call's block stays open until another call begins or the output finishes:
reasoning or text that arrives between two fragments of one call (an upstream
that interleaves them) is held and written after the call's block closes, so a
call is never cut into two blocks, the second without its id and name.

Spec: docs/DESIGN.md, "End states"; ARCHITECTURE.md, "The stream state machine".
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable

from sluicegate.core.events import (
    Delta,
    Finish,
    FinishReason,
    StreamEvent,
    ToolCallFragment,
)
from sluicegate.core.wire.machine import DELTA_STATE, WireMachine
from sluicegate.core.wire.padding import EventPadder, Filler

__all__ = ["REASONING", "TEXT", "BlockMachine"]


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

    __slots__ = ("_block", "_held", "_padder", "_text_frame")

    _CHOICES = "a response has one output"
    _ONE_OUTPUT = True

    def _prepare(self, filler: Filler | None, pad_step_bytes: int) -> None:
        self._padder = (
            EventPadder(filler, pad_step_bytes) if filler is not None else None
        )
        self._block: str | int | None = None  # REASONING, TEXT or a call's index
        # The open text block's delta of some text (bytes), else ``None``.
        self._text_frame: Callable[[str], bytes | None] = _closed
        # Reasoning and text that came while a call's block was open, in order.
        self._held: list[tuple[str, str]] = []

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
        reasoning = "" if parts is None else parts.reasoning
        if type(self._block) is int and (reasoning or text):
            self._held.append((reasoning, text))  # inside a call: after it
        else:
            self._write(reasoning, text, frames)
        if parts is not None:
            for fragment in parts.tool_calls:
                if fragment.name is not None or self._block != fragment.index:
                    self._switch(fragment.index, frames)
                    self._open_call(fragment, frames)
                if fragment.arguments:
                    self._arguments(fragment, frames)
        return frames

    def _write(self, reasoning: str, text: str, frames: list[bytes]) -> None:
        if reasoning:
            if self._block != REASONING:
                self._switch(REASONING, frames)
                self._open_reasoning(frames)
            self._reasoning(reasoning, frames)
        if text:
            if self._block != TEXT:
                self._switch(TEXT, frames)
                self._open_text(frames)
            frame = self._text_frame(text)
            assert frame is not None  # ``_open_text`` set the text block's
            frames.append(frame)

    def _finish(self, event: Finish) -> list[bytes]:
        frames: list[bytes] = []
        if self._held:
            self._release(frames)
        self._close(event.finish_reason, frames)
        return frames

    def _switch(self, block: str | int, frames: list[bytes]) -> None:
        """Close the open block (and any written from ``_held``); ``block``
        opens next."""
        self._release(frames)
        self._close(None, frames)
        self._block = block

    def _release(self, frames: list[bytes]) -> None:
        """Close the open block, then write what was held while it was a
        call's (the last block written stays open)."""
        self._close(None, frames)
        held, self._held = self._held, []
        for reasoning, text in held:
            self._write(reasoning, text, frames)

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
