"""One choice of an upstream's stream: its cumulative text detected, its finish reason.

``UpstreamChoice`` is what ``UpstreamReader`` (``core/upstream/reader.py``) keeps per
choice index: whether the choice repeats its text cumulatively, a text held
back until that is settled, its tool calls (``core/upstream/tools.py``) and
whether it finished.

Cumulative text: a choice is taken to repeat its text cumulatively when its
second non-empty text is longer than its first and starts with it, and its
third starts with the second. An ambiguous second text (it starts with the
first) is held back until the third text, the choice's finish or the stream's
end settles it (at a finish or end it counts as cumulative); from then on a
cumulative choice sends only what is new after the text so far (a text that
does not start with it is sent whole). A plain stream pays for this only on its
first two texts.

Finish reasons (``finish_reason_of``): a choice that made tool calls finishes
``TOOL_CALLS`` unless the upstream said ``length`` or a call's arguments are
not whole JSON (a call cut short is never reported as made): then ``LENGTH``
when the upstream said ``tool_calls`` (llama-cpp-python says so when
``max_tokens`` cuts a call), else ``STOP`` (the call ended on its own, as the
local engine reports it). One that made none never finishes ``TOOL_CALLS``.
"""

from __future__ import annotations

from sluicegate.core.events import FinishReason
from sluicegate.core.upstream.items import UpstreamDelta, UpstreamItem, UpstreamToolCall
from sluicegate.core.upstream.logprobs import TokenTexts
from sluicegate.core.upstream.tools import ToolCallNormalizer

__all__ = [
    "CONTENT",
    "NO_PART",
    "REASONING",
    "UpstreamChoice",
    "finish_reason_of",
    "settle_choice",
]

_LENGTH_REASONS = frozenset({"length", "max_tokens", "model_length"})
NO_PART, REASONING, CONTENT = 0, 1, 2
"""Ranks of the parts of a choice's output, in the order an upstream writes
them; its ``k``-th call (from 1) is ``CONTENT + k``."""


class UpstreamChoice:
    """Cumulative-text detection and finish bookkeeping of one choice."""

    __slots__ = (
        "chunks",
        "finished",
        "first",
        "held",
        "mode",
        "part",
        "seen",
        "token_texts",
        "tools",
    )

    def __init__(self) -> None:
        self.tools: ToolCallNormalizer | None = None  # at its first tool call
        self.token_texts: TokenTexts | None = None  # at its first logprobs
        self.mode: bool | None = None  # cumulative? None: not settled yet
        self.first = ""  # the first non-empty text
        self.held = ""  # an ambiguous second text, held back
        self.seen = ""  # cumulative: the upstream's whole text so far
        self.finished = False
        self.chunks = 0  # chunks counted towards max_tokens (count_output)
        self.part = NO_PART  # the latest part output went to

    def count_output(self, part: int) -> None:
        """Count a chunk with output in ``part`` (``REASONING``, ``CONTENT``,
        or ``CONTENT`` + the calls begun with it) towards ``max_tokens``.

        The first chunk of a part later than any before (but the choice's
        first) is not counted: llama.cpp's server writes one chunk per part a
        token changes (its reasoning, its content, its latest call, each call
        it begins), so such a chunk may carry the same token as the chunk
        before it. Parts only move on and a choice begins at most
        ``max_tool_calls`` calls, so that is all an upstream gains by it.
        """
        if part > self.part:
            later = self.part != NO_PART
            self.part = part
            if later:
                return
        self.chunks += 1

    def counted_past(self, part: int, max_chunks: int) -> bool:
        """Whether a chunk with output in ``part`` would be counted once
        ``max_chunks`` are (-1: never)."""
        if self.chunks != max_chunks:
            return False
        return not (part > self.part and self.part != NO_PART)

    def feed(self, text: str) -> str:
        """What of ``text`` (non-empty) is new."""
        mode = self.mode
        if mode is False:
            return text
        if mode is True:
            seen = self.seen
            if text.startswith(seen):
                self.seen = text
                return text[len(seen) :]
            self.seen = seen + text
            return text
        if not self.first:
            self.first = text
            return text
        if not self.held:
            if len(text) > len(self.first) and text.startswith(self.first):
                self.held = text
                return ""
            self.mode = False
            return text
        held = self.held
        self.held = ""
        if len(text) >= len(held) and text.startswith(held):
            self.mode = True
            self.seen = text
            return text[len(self.first) :]
        self.mode = False
        return held + text

    def settle(self) -> str:
        """End of the choice's text: a held text counts as cumulative."""
        held = self.held
        if not held:
            return ""
        self.held = ""
        self.mode = True
        self.seen = held
        return held[len(self.first) :]


def settle_choice(
    index: int, state: UpstreamChoice, out: list[UpstreamItem]
) -> ToolCallNormalizer | None:
    """A choice's held text and held tool-call start; its calls, if any."""
    held = state.settle()
    if held:
        out.append(UpstreamDelta(index, held))
    tools = state.tools
    if tools is not None:
        out.extend(UpstreamToolCall(index, f) for f in tools.flush())
    return tools


def finish_reason_of(reason: str, tools: ToolCallNormalizer | None) -> FinishReason:
    """The finish reason of a choice the upstream ended with ``reason`` (not
    ``abort`` or ``error``), given its tool calls (``None``: none began)."""
    if reason in _LENGTH_REASONS:
        return FinishReason.LENGTH
    if reason == "content_filter":
        return FinishReason.CONTENT_FILTER
    if tools is None or not tools.calls:
        return FinishReason.STOP
    if not tools.open_call:
        return FinishReason.TOOL_CALLS
    # an unfinished call: cut short, or it ended on its own
    return FinishReason.LENGTH if reason == "tool_calls" else FinishReason.STOP
