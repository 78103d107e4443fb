"""The ``Delta`` events of a response's choices: text, reasoning, tool calls, logprobs.

``add_text``, ``add_reasoning`` and ``add_tool_calls`` append the ``Delta``
events of one step's pieces. ``LogprobDeltas`` feeds one step of a choice with
logprobs through its decoder token by token (a token engine's ids, or a text
engine's tokens with their parts of the text) and through the choice's aligner,
and appends a ``Delta`` for each piece of text the aligner releases, with the
logprobs of the tokens that piece completes.

Invariants:
    - Logprobs are the content's (OpenAI's reasoning models give none for
      their reasoning): a token spent inside the reasoning carries none; the
      one that ends it carries its content part only.
    - A token's logprob goes out with the ``Delta`` that holds the end of its
      text; a token offset counts the choice's text, echo included (chars).
    - Every ``Delta`` carries the usage so far when the tally is continuous.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.choice_setup import ChoiceState, TextChoiceDecoder
from sluicegate.core.decoding.reasoning import ReasoningPhase
from sluicegate.core.decoding.reasoning_choice import ReasoningChoiceDecoder
from sluicegate.core.decoding.usage import UsageTally
from sluicegate.core.errors import EngineError
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    EngineOutput,
    FinishReason,
    StreamEvent,
    TextOutput,
    TokenLogprob,
    ToolCallFragment,
)
from sluicegate.core.logprobs import AlignedStep, LogprobToken, describe_logprob

__all__ = [
    "ANY_CALLS",
    "NO_CALL",
    "CallRule",
    "CallTerms",
    "LogprobDeltas",
    "add_reasoning",
    "add_text",
    "add_tool_calls",
]


def add_text(
    events: list[StreamEvent], index: int, text: str, tally: UsageTally
) -> None:
    """Append a ``Delta`` of choice ``index``'s ``text`` (no logprobs), if any."""
    if text:
        events.append(Delta(index, text, None, tally.so_far()))


def add_reasoning(
    events: list[StreamEvent], index: int, text: str, tally: UsageTally
) -> None:
    """Append a ``Delta`` of choice ``index``'s reasoning ``text`` (no content),
    if any."""
    if text:
        parts = DeltaParts(reasoning=text)
        events.append(Delta(index, "", None, tally.so_far(), parts))


def add_tool_calls(
    events: list[StreamEvent],
    index: int,
    fragments: tuple[ToolCallFragment, ...],
    max_calls: int | None,
    tally: UsageTally,
) -> bool:
    """Append one ``Delta`` per fragment of a text engine's calls in choice
    ``index``.

    Returns:
        True, with the fragments before it appended, at the first fragment of
        a call past ``max_calls`` (the calls before it are whole, in order);
        else False (``max_calls`` ``None``: no limit).
    """
    for fragment in fragments:
        if max_calls is not None and fragment.index >= max_calls:
            return True
        parts = DeltaParts((fragment,))
        events.append(Delta(index, "", None, tally.so_far(), parts))
    return False


@dataclass(frozen=True, slots=True)
class CallTerms:
    """What a request's ``tool_choice`` and ``parallel_tool_calls`` let each
    choice of a text engine call (OpenAI's contract), for ``CallRule``.

    Attributes:
        most: calls one choice may bring back (1: ``parallel_tool_calls:
            false`` or a named choice; 0: ``"none"``); ``None``: no limit.
        required: each choice must call (``"required"``, or a named choice).
        name: the one function each call must name (a named choice), or
            ``None``: any offered one.

    Spec: OpenAI API reference, "Create chat completion", ``tool_choice`` and
    ``parallel_tool_calls``.
    """

    most: int | None = None
    required: bool = False
    name: str | None = None


ANY_CALLS = CallTerms()
"""The terms of a request that sets no rule: any calls, or none."""


class CallRule:
    """The calls a text engine's choices may bring back, by ``CallTerms``,
    enforced whatever the engine did.

    A call past ``most`` cuts its choice (the calls before it stand); a call
    naming another function than ``name`` never goes out, and its choice fails
    (``failure``) as one that had to call and did not.

    Args:
        terms: the request's terms.
        choices: the response's choices.
    """

    __slots__ = ("most", "terms", "uncalled", "wrong")

    def __init__(self, terms: CallTerms, choices: int) -> None:
        self.terms = terms
        self.most = terms.most
        self.uncalled = set(range(choices)) if terms.required else set()
        self.wrong: dict[int, str] = {}  # choice -> the other function it called

    def add(
        self,
        events: list[StreamEvent],
        index: int,
        fragments: tuple[ToolCallFragment, ...],
        tally: UsageTally,
    ) -> bool:
        """``add_tool_calls`` under the terms; True where the choice is cut:
        at a call past ``most``, or at one naming another function (nothing of
        it goes out; ``failure`` names it)."""
        name, most = self.terms.name, self.most
        for i, fragment in enumerate(fragments if name is not None else ()):
            if most is not None and fragment.index >= most:
                break  # past the limit: cut there, whatever it names
            if fragment.name is not None and fragment.name != name:
                self.wrong[index] = fragment.name
                add_tool_calls(events, index, fragments[:i], most, tally)
                return True
        if fragments:
            self.uncalled.discard(index)
        return add_tool_calls(events, index, fragments, self.most, tally)

    def failure(self, index: int, reason: FinishReason | None) -> str | None:
        """Why choice ``index``, ending for ``reason`` (``None``: on a stop
        string or cut here), fails: it called another function than the named
        one, or it ends without the call it must bring (one cut by its token
        limit does not: the client's limit, not the engine's choice); else
        ``None``."""
        name = self.terms.name
        wrong = self.wrong.get(index)
        if wrong is not None:
            return f"The engine called {wrong!r}, though tool_choice named {name!r}"
        if index not in self.uncalled or reason is FinishReason.LENGTH:
            return None
        if name is not None:
            return (
                f"The engine answered without calling {name!r}, "
                "though tool_choice named it"
            )
        return NO_CALL


NO_CALL = 'The engine answered without a tool call, though tool_choice was "required"'
"""The in-band error of a choice that had to call (``"required"``) and ended
without a call."""


class LogprobDeltas:
    """The steps of a response's choices with logprobs, as ``Delta`` events.

    Args:
        pieces: the token engine's pieces (bytes of each token id), for the
            logprobs' token text; ``()`` for a text engine.
        tally: the response's usage, for each ``Delta``.
    """

    __slots__ = ("_pieces", "_tally")

    def __init__(self, pieces: Sequence[bytes], tally: UsageTally) -> None:
        self._pieces = pieces
        self._tally = tally

    def feed_tokens(
        self,
        choice: ChoiceState,
        decoder: ChoiceDecoder,
        output: EngineOutput,
        events: list[StreamEvent],
    ) -> ChoiceStep:
        """A token engine's step, its tokens one by one through ``decoder`` and
        the choice's aligner; appends its ``Delta`` events.

        Returns:
            The last token's step (it has the finish reason of a stop string).

        Raises:
            EngineError: not one logprob per token id.
        """
        aligner = choice.aligner
        assert aligner is not None, "a choice with logprobs has an aligner"
        assert choice.detokenizer is not None, "logprobs need token ids"
        logprobs = output.logprobs or ()
        if len(logprobs) != len(output.token_ids):
            raise EngineError(f"expected one logprob per token id; got {output!r}")
        step = ChoiceStep("")
        splitting = decoder if isinstance(decoder, ReasoningChoiceDecoder) else None
        for token_id, logprob in zip(output.token_ids, logprobs, strict=True):
            before = ReasoningPhase.CONTENT if splitting is None else splitting.phase
            step = decoder.feed((token_id,))
            if splitting is not None and before is not ReasoningPhase.CONTENT:
                # A token spent inside the reasoning carries no logprob; the
                # one that ends it carries its content.
                add_reasoning(events, choice.index, step.reasoning, self._tally)
                after = splitting.phase
                if after is ReasoningPhase.START:
                    choice.held_logprobs.append(logprob)
                    continue
                if after is ReasoningPhase.REASONING or not step.text:
                    choice.held_logprobs.clear()  # the reasoning opened, or ended
                    continue
                if step.text and not step.reasoning:
                    self._release_held(choice)  # the start marker ruled out
                choice.held_logprobs.clear()
                if step.finish_reason is None:  # it ended the reasoning
                    logprob = splitting.answer_logprob(logprob, step.text, self._pieces)
            choice.released_chars += len(step.text)
            end: int | None = choice.released_chars + len(decoder.held)
            if choice.detokenizer.pending_bytes or step.finish_reason is not None:
                end = None  # the token's text is incomplete, or it hit a stop
            aligned = aligner.feed(step.text, logprob, end)
            self._delta(choice, aligned.text, aligned.tokens, events)
            if step.finish_reason is not None:
                break
        return step

    def feed_text(
        self,
        choice: ChoiceState,
        decoder: TextChoiceDecoder,
        item: TextOutput,
        events: list[StreamEvent],
    ) -> ChoiceStep:
        """A text engine's step, token by token (each with its part of the text)
        through the stop matcher and the aligner (text without tokens: one
        piece); appends its ``Delta`` events.

        Returns:
            The step: the last piece's text and finish reason, and all the
            reasoning a splitter took from the pieces.
        """
        aligner = choice.text_aligner
        assert aligner is not None, "called for a choice with logprobs"
        tokens = item.logprobs
        texts = item.token_texts or tuple(t.token for t in tokens or ())
        pieces: list[tuple[str, LogprobToken | None]] = [(item.text, None)]
        if tokens and "".join(texts) == item.text:
            pieces = list(zip(texts, tokens, strict=True))
        step, count = ChoiceStep(""), item.completion_tokens
        reasoning = ""  # a splitter's (the upstream's own comes apart)
        for text, token in pieces:
            before = decoder.phase
            step, count = decoder.feed(text, count), 0
            reasoning += step.reasoning
            if before is not ReasoningPhase.CONTENT:
                # As for token ids (feed_tokens): a token spent inside the
                # reasoning carries no logprob; the one that ends it carries
                # its content part; held ones are content if no marker opens.
                after = decoder.phase
                if after is ReasoningPhase.START:
                    choice.held_tokens.append(token)
                    continue
                if after is ReasoningPhase.REASONING or not step.text:
                    choice.held_tokens.clear()  # the reasoning opened, or ended
                    continue
                if not step.reasoning:
                    self._release_held_tokens(choice)  # the start marker ruled out
                choice.held_tokens.clear()
                token = decoder.answer_token(token, step.text)
            choice.released_chars += len(step.text)
            end: int | None = choice.released_chars + len(decoder.held)
            if step.finish_reason is not None:
                end = None  # it completed a stop string
            self._text_delta(choice, aligner.feed(step.text, token, end), events)
            if step.finish_reason is not None:
                break
        return ChoiceStep(step.text, step.finish_reason, reasoning)

    def flush(self, choice: ChoiceState, text: str, events: list[StreamEvent]) -> None:
        """The choice ended with ``text`` (its decoder's tail; ``""`` after a
        stop string): what its aligner held goes out with it, in ``Delta``
        events. Tokens held as a possible start marker were content if text
        follows them."""
        if text and choice.held_logprobs:
            self._release_held(choice)  # a held start marker was text
        if text and choice.held_tokens:
            self._release_held_tokens(choice)
        if choice.aligner is not None:
            aligned = choice.aligner.flush(text)
            self._delta(choice, aligned.text, aligned.tokens, events)
        elif choice.text_aligner is not None:
            self._text_delta(choice, choice.text_aligner.flush(text), events)

    def _release_held(self, choice: ChoiceState) -> None:
        """The tokens held as a possible start marker are content after all:
        into the aligner, their ends with the text that releases them."""
        aligner = choice.aligner
        assert aligner is not None, "held logprobs come with an aligner"
        for held in choice.held_logprobs:
            aligner.feed("", held, None)
        choice.held_logprobs.clear()

    def _release_held_tokens(self, choice: ChoiceState) -> None:
        """``_release_held`` for a text engine's tokens."""
        aligner = choice.text_aligner
        assert aligner is not None, "held tokens come with an aligner"
        for held in choice.held_tokens:
            aligner.feed("", held, None)
        choice.held_tokens.clear()

    def _delta(
        self,
        choice: ChoiceState,
        text: str,
        tokens: tuple[tuple[TokenLogprob, int], ...],
        events: list[StreamEvent],
    ) -> None:
        """Append a ``Delta`` of ``text`` with its tokens' logprobs, if any."""
        if not text and not tokens:
            return
        offset, pieces = len(choice.echo), self._pieces
        logprobs = tuple(
            describe_logprob(pieces, logprob, offset + start)
            for logprob, start in tokens
        )
        events.append(Delta(choice.index, text, logprobs, self._tally.so_far()))

    def _text_delta(
        self,
        choice: ChoiceState,
        aligned: AlignedStep[LogprobToken | None],
        events: list[StreamEvent],
    ) -> None:
        """A ``Delta`` of a text engine's aligned text, its tokens' offsets
        counted in the choice's text (echo included)."""
        if not aligned.text and not aligned.tokens:
            return
        offset = len(choice.echo)
        logprobs = tuple(
            dataclasses.replace(token, text_offset=offset + start)
            for token, start in aligned.tokens
            if token is not None
        )
        events.append(Delta(choice.index, aligned.text, logprobs, self._tally.so_far()))
