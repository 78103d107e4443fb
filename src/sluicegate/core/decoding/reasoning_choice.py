"""One choice's token ids -> reasoning and content: detokenizer, splitter, stops.

``ReasoningChoiceDecoder`` is the ``ChoiceDecoder`` of a choice whose model
reasons (a ``ReasoningParser`` that ``reasons``): each token's text goes
through a ``ReasoningSplitter``, and only the content it releases meets the
stop matcher. ``request_reasoning`` decides, for one request, where the
output begins (inside the reasoning or not) from the rendered prompt and the
request's options.

Invariants (besides ``ChoiceDecoder``'s):

- Token ids are taken one at a time, so ``reasoning_tokens`` counts exactly the
  tokens up to and including the one that completed the end marker, whatever
  way the ids are split into ``feed`` calls (the splitter's own count).
- Stop strings are matched on the content only: a stop string the reasoning
  restates does not end the choice (docs/DESIGN.md, "Reasoning"). Once one
  matched, later ids are discarded and not counted.
- A cut (``flush()`` at ``max_tokens``, an end-of-sequence token inside the
  reasoning) releases every held character to its channel.

Spec: docs/DESIGN.md, "Reasoning".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.reasoning import (
    ReasoningPhase,
    ReasoningSplitter,
    ReasoningStep,
)
from sluicegate.core.decoding.reasoning_parsers import ReasoningParser, opened_by_prompt
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import FinishReason, TokenLogprob

__all__ = ["ReasoningChoiceDecoder", "request_reasoning"]

_NOTHING = ChoiceStep("")


class ReasoningChoiceDecoder(ChoiceDecoder):
    """Token ids of one choice in; reasoning and content text out.

    Args:
        detokenizer: a fresh detokenizer for this choice (owned from now on).
        stops: a fresh stop matcher, for the content (owned from now on).
        splitter: a fresh splitter with the request's markers (owned from now
            on).
        budget_tokens: the most tokens the reasoning may take (Messages
            ``thinking.budget_tokens``), for an engine that does not close the
            reasoning itself: at the token that reaches it the reasoning ends
            (``ReasoningSplitter.end_reasoning``) and what the model writes
            after is content, verbatim; ``None``: no budget, or one the engine
            enforces (the end marker it forces ends the reasoning here as the
            model's own does).
    """

    __slots__ = ("_budget", "_splitter")

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer | WindowedDetokenizer,
        stops: StopMatcher,
        splitter: ReasoningSplitter,
        budget_tokens: int | None = None,
    ) -> None:
        super().__init__(detokenizer, stops)
        self._splitter = splitter
        self._budget = budget_tokens

    @property
    def reasoning_tokens(self) -> int:
        """Tokens spent inside the reasoning so far, markers included."""
        return self._splitter.reasoning_tokens

    @property
    def phase(self) -> ReasoningPhase:
        """The splitter's phase now (``CONTENT``: every later token is content)."""
        return self._splitter.phase

    def answer_logprob(
        self, logprob: TokenLogprob, text: str, pieces: Sequence[bytes]
    ) -> TokenLogprob:
        """The logprob of the token that ended the reasoning and began the
        answer, reported as the answer's first token: its piece's bytes before
        the answer (reasoning and end-marker characters) skipped
        (``TokenLogprob.skip_bytes``); the logprob is the whole token's.

        Args:
            logprob: that token's, from the engine.
            text: the content the step released (what the stop matcher holds
                of it is added here).
            pieces: the vocabulary's piece bytes, by token id.

        Returns:
            ``logprob`` unchanged when the token's piece holds no answer after
            other bytes (its content came with earlier tokens' held text).
        """
        skip = pieces[logprob.token_id].rfind((text + self.held).encode())
        return dataclasses.replace(logprob, skip_bytes=skip) if skip > 0 else logprob

    def feed(self, token_ids: Iterable[int]) -> ChoiceStep:
        """Take one engine step's token ids; see ``ChoiceDecoder.feed``.

        Returns:
            ``ChoiceStep(content, finish_reason, reasoning)``: the reasoning
            safe to send now (it comes first), the content safe to send now, and
            ``FinishReason.STOP`` on the step where a stop string completes in
            the content. After that, ``ChoiceStep("")`` for every call.

        Raises:
            LocalProtocolError: after ``flush()``.
            ValueError: a token id outside the detokenizer's vocabulary.
        """
        if self._closed:
            raise LocalProtocolError("ChoiceDecoder.feed() after flush()")
        if self._stopped:
            return _NOTHING
        detokenizer, splitter, stops = self._detokenizer, self._splitter, self._stops
        budget = self._budget
        reasoning = content = ""
        for token_id in token_ids:
            step = splitter.feed(detokenizer.feed((token_id,)))
            self._completion_tokens += 1
            if (
                budget is not None
                and splitter.reasoning_tokens >= budget
                and splitter.phase is not ReasoningPhase.CONTENT
            ):
                closing = splitter.end_reasoning()
                step = ReasoningStep(
                    step.reasoning + closing.reasoning,
                    step.content + closing.content,
                    closing.phase,
                )
            reasoning += step.reasoning
            if step.content:
                matched = stops.feed(step.content)
                content += matched.text
                if matched.stop is not None:
                    self._stopped = True
                    return ChoiceStep(content, FinishReason.STOP, reasoning)
        if not reasoning and not content:
            return _NOTHING
        return ChoiceStep(content, None, reasoning)

    def flush(self) -> ChoiceStep:
        """End of the choice: the detokenizer's tail through the splitter and
        the stop matcher, then what each held. Ends the object.

        Returns:
            As ``ChoiceDecoder.flush``, with the held reasoning in ``reasoning``
            (a stream cut inside the reasoning: all of it).

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("ChoiceDecoder.flush() called twice")
        self._closed = True
        tail = self._detokenizer.flush()
        stops, splitter = self._stops, self._splitter
        if stops.finished:
            stops.flush()
            splitter.flush()
            return _NOTHING
        # The tail's tokens were counted when they were fed.
        first = splitter.feed(tail, 0)
        last = splitter.flush()
        reasoning = first.reasoning + last.reasoning
        matched = stops.feed(first.content + last.content)
        if matched.stop is not None:
            stops.flush()
            return ChoiceStep(matched.text, FinishReason.STOP, reasoning)
        return ChoiceStep(matched.text + stops.flush(), None, reasoning)


def request_reasoning(
    parser: ReasoningParser | None,
    prompt: str,
    *,
    thinking: bool | None = None,
) -> ReasoningParser | None:
    """The markers one request is decoded with, ``starts_inside`` decided.

    The rendered prompt decides first (``opened_by_prompt``: a template that
    opened the reasoning, or wrote an empty block); else the request's
    ``thinking`` option (``True``: the output begins inside the reasoning, a
    start marker the model writes anyway is dropped; ``False``: it begins
    outside, and is reasoning only if the model opens a block itself); else
    the parser's default. (A grammar, for tools or a response format, then
    applies after the reasoning: the server wraps it.)

    Args:
        parser: the served model's parser, or ``None`` (no reasoning).
        prompt: the rendered prompt's text, generation prompt included.
        thinking: the request's choice (``chat_template_kwargs.enable_thinking``,
            ``reasoning_effort``, Messages ``thinking``), or ``None`` for none.

    Returns:
        ``None`` when there is no reasoning channel (no parser, one that does
        not reason, or one without a start marker for an output that begins
        outside); else the parser with this request's ``starts_inside``.
    """
    if parser is None or not parser.reasons:
        return None
    inside = opened_by_prompt(prompt, parser)
    if inside is None:
        inside = parser.starts_inside if thinking is None else thinking
    if not inside and not parser.start:
        return None  # a family with no start marker can only begin inside
    if inside == parser.starts_inside:
        return parser
    return dataclasses.replace(parser, starts_inside=inside)
