"""Reasoning split from content, with minimal holdback of split markers.

A thinking model writes its reasoning between a start and an end marker
(``<think>`` and ``</think>`` for DeepSeek-R1 and Qwen3), then its answer.
``ReasoningSplitter`` takes the detokenized text of one choice piece by piece
and returns what is safe to send as reasoning and as content; a
``ReasoningParser`` (chosen by name from ``REASONING_PARSERS``) says which
markers a model family writes and whether its chat template already opened the
reasoning.

The grammar the splitter reads (one reasoning block, at the start)::

    output  = [start] reasoning [end content]     (starts inside)
            | start reasoning [end content]       (the model opens it)
            | content                             (anything else)

- The start marker counts only as the very first characters of the output.
  When the template opened the reasoning, a start marker the model writes again
  is dropped (older DeepSeek-R1 checkpoints do); when it did not, output that
  does not begin with the start marker is all content (Qwen3 with thinking
  switched off, or a model that chose not to think).
- The first end marker inside the reasoning ends it. Everything after it is
  content, verbatim: a later ``<think>`` or ``</think>`` is text of the answer.
- Markers appear in neither channel. Nothing else is added, removed or moved:
  reasoning, then the end marker, then content, with the start marker where the
  model wrote it, is the input again (property-tested).

Invariants (property-tested):

- For any split of the input into ``feed`` calls, the concatenated reasoning
  and the concatenated content (each with ``flush()``) are the same.
- Held text is the longest suffix of the pending text that is a proper prefix of
  the marker awaited, so shorter than that marker; it is released, to the
  channel it belongs to, by the first character that rules the marker out.
- No content is returned before the last reasoning: once a step has content,
  later steps have no reasoning.

Whitespace: kept exactly. DeepSeek-R1 writes ``"<think>\\n"`` and
``"</think>\\n\\n"``; the reasoning then begins with ``"\\n"`` (when the model
wrote the start marker) and the content with ``"\\n\\n"``. vLLM's parsers do the
same (they cut at the marker tokens and keep the text around them); llama.cpp's
server trims the reasoning on both sides and skips whitespace after the end
marker. Trimming the reasoning's tail in a stream would hold back every run of
whitespace until the next word; an API that wants trimmed text trims the whole
message the same way when it renders the non-streamed answer, so this layer
stays lossless and the token accounting exact.

A stream cut before the end (``max_tokens``, a stop, an error) calls ``flush()``,
which releases held text to the channel it was held in: a partial marker the
model never finished is text it wrote, as in ``StopMatcher.flush``. Deliberate
divergence: llama.cpp drops a trailing partial end marker from the final
message.

Counting: ``reasoning_tokens`` counts the ``feed`` calls that belong to the
reasoning: from the first call up to and including the one that completes the
end marker (or all of them, when the stream ends inside the reasoning), none
when the output turned out to be content only. Fed one token's text per call
(empty text included), it is the number of reasoning tokens, start and end
markers included, whatever way the markers are split into tokens.

What others do (read, not copied): vLLM's ``deepseek_r1`` and ``qwen3``
parsers find the markers as single token ids in each delta, so they need the
markers to be special tokens of the vocabulary and cannot see a marker spelled
in several tokens; llama.cpp re-parses the whole message after every token and
treats a trailing partial marker as pending. This splitter matches characters,
so any tokenization works, and its cost is linear in the text.

Spec: DeepSeek-R1 model card ("enforce the model to initiate its response with
``<think>\\n``"); Qwen3 model card (``enable_thinking``); vLLM documentation,
"Reasoning Outputs" (``--reasoning-parser``, ``reasoning_content``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sluicegate.core.decoding.reasoning_parsers import ReasoningParser
from sluicegate.core.errors import LocalProtocolError

# ReasoningParser (from reasoning_parsers) is the splitter's argument: here too.
__all__ = ["ReasoningParser", "ReasoningPhase", "ReasoningSplitter", "ReasoningStep"]


class ReasoningPhase(StrEnum):
    """Where a ``ReasoningSplitter`` stands in the output."""

    START = "start"
    """Nothing decided yet: the output so far may still be the start marker."""
    REASONING = "reasoning"
    """Inside the reasoning: text goes to ``reasoning`` until the end marker."""
    CONTENT = "content"
    """After the reasoning, or no reasoning at all: text goes to ``content``."""


@dataclass(frozen=True, slots=True)
class ReasoningStep:
    """Result of ``ReasoningSplitter.feed`` and ``flush``.

    Attributes:
        reasoning: reasoning text safe to emit now (markers never included).
        content: content text safe to emit now; when both are non-empty, the
            reasoning comes first in the output.
        phase: the splitter's phase after this step.
    """

    reasoning: str
    content: str
    phase: ReasoningPhase


class ReasoningSplitter:
    """Splits one choice's text into reasoning and content, holding back only a
    suffix that may still become the marker awaited.

    Args:
        parser: the model family's markers (``reasoning_parser(name)``).
        starts_inside: overrides ``parser.starts_inside`` for one request (a
            request option that opened the reasoning in the prompt, or closed
            it); ``None`` keeps the parser's.

    Raises:
        ValueError: ``starts_inside=True`` with a parser without reasoning, or
            ``starts_inside=False`` with a parser without a start marker.
    """

    __slots__ = ("_closed", "_feeds", "_held", "_inside", "_parser", "_phase", "_spent")

    def __init__(
        self, parser: ReasoningParser, *, starts_inside: bool | None = None
    ) -> None:
        if starts_inside is not None and starts_inside != parser.starts_inside:
            parser = ReasoningParser(
                parser.name, parser.start, parser.end, starts_inside
            )
        self._parser = parser
        self._inside = parser.starts_inside
        if parser.start:
            self._phase = ReasoningPhase.START
        elif parser.starts_inside:
            self._phase = ReasoningPhase.REASONING
        else:
            self._phase = ReasoningPhase.CONTENT
        self._held = ""
        self._feeds = 0  # feed calls so far, while the phase is START or REASONING
        self._spent = 0  # feed calls known to belong to the reasoning
        self._closed = False

    @property
    def parser(self) -> ReasoningParser:
        """The markers in use (with the ``starts_inside`` of this splitter)."""
        return self._parser

    @property
    def phase(self) -> ReasoningPhase:
        """Where the splitter stands now."""
        return self._phase

    @property
    def held(self) -> str:
        """Text held back now: a proper prefix of the marker awaited, or ``""``."""
        return self._held

    @property
    def reasoning_tokens(self) -> int:
        """``feed`` calls that belong to the reasoning so far (see the module
        docstring); while the phase is ``START``, the calls since the start are
        not counted yet: they count once the start marker completes."""
        return self._spent

    def feed(self, text: str, tokens: int = 1) -> ReasoningStep:
        """Take the next ``text`` and return what is safe to emit now.

        Args:
            text: the next characters of the choice (may be empty; an empty call
                still counts in ``reasoning_tokens``, as one token's text).
            tokens: the tokens ``text`` stands for (>= 0; default one): what
                this call adds to the count. 0 for text of tokens already
                counted (a detokenizer's tail at the end); an engine that yields
                text gives its step's count.

        Returns:
            The reasoning and the content no marker can still claim, markers
            removed, and the phase after this text.

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        if self._closed:
            raise LocalProtocolError("ReasoningSplitter.feed() after flush()")
        phase = self._phase
        if phase is ReasoningPhase.CONTENT:
            return ReasoningStep("", text, phase)
        self._feeds += tokens
        if phase is ReasoningPhase.REASONING:
            self._spent = self._feeds
            if not self._held and self._parser.end[0] not in text:
                # No marker can start in ``text``: all of it is reasoning (the
                # common case, one set test).
                return ReasoningStep(text, "", phase)
            return self._reason(self._held + text)
        return self._begin(self._held + text)

    def flush(self) -> ReasoningStep:
        """Release what is held and end the object.

        Returns:
            The held text, in the channel it was held for: a partial start marker
            is content (or reasoning, when the output starts inside it), a
            partial end marker is reasoning.

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("ReasoningSplitter.flush() called twice")
        self._closed = True
        held, self._held = self._held, ""
        if self._phase is ReasoningPhase.START:
            self._phase = (
                ReasoningPhase.REASONING if self._inside else ReasoningPhase.CONTENT
            )
            self._spent = self._feeds if self._inside else 0
        if self._phase is ReasoningPhase.REASONING:
            return ReasoningStep(held, "", self._phase)
        return ReasoningStep("", held, self._phase)

    def end_reasoning(self) -> ReasoningStep:
        """End the reasoning now (its budget is spent): what is held goes out as
        reasoning, and every later character is content, verbatim (an end
        marker the model writes later included). Nothing changes once the
        phase is ``CONTENT``.

        Returns:
            The held text in its channel (a partial start marker of an output
            that does not start inside is content), phase ``CONTENT``.

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        if self._closed:
            raise LocalProtocolError("ReasoningSplitter.end_reasoning() after flush()")
        phase = self._phase
        held, self._held = self._held, ""
        self._phase = ReasoningPhase.CONTENT
        if phase is ReasoningPhase.CONTENT or (
            phase is ReasoningPhase.START and not self._inside
        ):
            return ReasoningStep("", held, ReasoningPhase.CONTENT)
        if phase is ReasoningPhase.START:
            self._spent = self._feeds
        return ReasoningStep(held, "", ReasoningPhase.CONTENT)

    def _begin(self, pending: str) -> ReasoningStep:
        """Phase ``START``: decide from ``pending`` (all output so far) whether it
        begins with the start marker."""
        start = self._parser.start
        if pending.startswith(start):
            self._spent = self._feeds
            return self._reason(pending[len(start) :])
        if start.startswith(pending):
            self._held = pending
            return ReasoningStep("", "", ReasoningPhase.START)
        self._held = ""
        if self._inside:
            self._spent = self._feeds
            return self._reason(pending)
        self._phase = ReasoningPhase.CONTENT
        return ReasoningStep("", pending, ReasoningPhase.CONTENT)

    def _reason(self, pending: str) -> ReasoningStep:
        """Inside the reasoning: ``pending`` is the held text and the new text."""
        end = self._parser.end
        self._phase = ReasoningPhase.REASONING
        at = pending.find(end)
        if at >= 0:
            self._held = ""
            self._phase = ReasoningPhase.CONTENT
            return ReasoningStep(pending[:at], pending[at + len(end) :], self._phase)
        keep = _held_suffix(pending, end)
        self._held = pending[len(pending) - keep :] if keep else ""
        return ReasoningStep(pending[: len(pending) - keep], "", self._phase)


def _held_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of
    ``marker`` (``marker`` does not occur in ``text``)."""
    first = marker[0]
    # Only a suffix starting with the marker's first character can qualify;
    # most tokens have none in their last len(marker) - 1 characters.
    window = len(marker) - 1
    at = text.find(first, max(len(text) - window, 0))
    while at >= 0:
        if marker.startswith(text[at:]):
            return len(text) - at
        at = text.find(first, at + 1)
    return 0
