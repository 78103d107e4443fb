"""How one choice of a response is set up for decoding: its options and decoders.

``ChoiceOptions`` says what a choice echoes and which token ids end it;
``new_detokenizer`` turns them and a ``Vocabulary`` into the detokenizer of a
token engine's choice (which ids never become text). ``TextChoiceDecoder`` is the
decoder of an engine that yields text: it skips all token work. ``new_choice``
puts a choice's decoders together in the ``ChoiceState`` that ``ResponseDecoder``
keeps for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.reasoning import ReasoningPhase, ReasoningSplitter
from sluicegate.core.decoding.reasoning_choice import ReasoningChoiceDecoder
from sluicegate.core.decoding.reasoning_parsers import ReasoningParser
from sluicegate.core.decoding.stop_pattern import StopPattern
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.events import FinishReason, TokenLogprob
from sluicegate.core.logprobs import LogprobAligner, LogprobToken

__all__ = [
    "ChoiceDecoding",
    "ChoiceOptions",
    "ChoiceState",
    "TextChoiceDecoder",
    "Vocabulary",
    "new_choice",
    "new_detokenizer",
]


class Vocabulary(Protocol):
    """What decoding token ids needs of a tokenizer (``Tokenizer`` extends it)."""

    @property
    def pieces(self) -> Sequence[bytes]:
        """Bytes of every token id's piece (special tokens map to their text)."""
        ...

    @property
    def special_ids(self) -> frozenset[int]:
        """Control tokens (BOS, EOS, end of turn, ...), kept out of the text
        unless asked for."""
        ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """End-of-generation tokens (EOS, end of turn)."""
        ...


@dataclass(frozen=True, slots=True)
class ChoiceOptions:
    """How one choice is decoded.

    Attributes:
        echo: text sent before the engine's first token (completions ``echo``).
        stop_token_ids: token ids that end the choice (never in its text).
        ignore_eos: the vocabulary's stop ids do not end the choice, and so may
            reach the text as any control token does.
    """

    echo: str = ""
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False


class TextChoiceDecoder:
    """A ``ChoiceDecoder`` for an engine that yields text: the stop matcher only,
    after a reasoning splitter when one is given.

    Args:
        stops: a fresh stop matcher for this choice (owned from now on).
        splitter: a fresh splitter (owned from now on) for an upstream whose
            plain text holds its reasoning markers; ``None``: no splitting.
        budget_tokens: the most reasoning tokens sent (``within_budget``);
            ``None``: no budget.

    Attributes:
        completion_tokens: the tokens fed before a stop string matched, as the
            engine counted them (all of the step that completed the stop).
    """

    __slots__ = (
        "_budget",
        "_held_split",
        "_reasoned",
        "_splitter",
        "_stops",
        "completion_tokens",
    )

    def __init__(
        self,
        stops: StopMatcher,
        splitter: ReasoningSplitter | None = None,
        budget_tokens: int | None = None,
    ) -> None:
        self._stops = stops
        self._splitter = splitter
        self._budget = budget_tokens
        self._reasoned = 0  # tokens of the steps whose reasoning was sent
        self._held_split: tuple[str, str] | None = None  # see ``engine_splits``
        self.completion_tokens = 0

    @property
    def splits(self) -> bool:
        """Whether the text goes through a reasoning splitter."""
        return self._splitter is not None

    @property
    def phase(self) -> ReasoningPhase:
        """The splitter's phase now (``CONTENT`` without one: all is content)."""
        return (
            ReasoningPhase.CONTENT if self._splitter is None else self._splitter.phase
        )

    @property
    def reasoning_tokens(self) -> int:
        """The splitter's count (each step counts as the tokens it stands for);
        0 without one."""
        return 0 if self._splitter is None else self._splitter.reasoning_tokens

    @property
    def stop(self) -> str | None:
        """The stop string that matched, or ``None``."""
        return self._stops.stop

    @property
    def held(self) -> str:
        """Text the stop matcher holds back now (not yet safe to send)."""
        return self._stops.held

    def within_budget(self, reasoning: str, tokens: int) -> str:
        """The part of one step's ``reasoning`` (the upstream's own, or split
        here; standing for ``tokens`` tokens) that is sent: all of it while the
        steps sent so far hold fewer than ``budget_tokens`` tokens, then
        ``""``: the upstream did not end its reasoning at the budget, so the
        reasoning channel is cut there (what it reasons after is dropped, and
        still counted in the usage); its content still follows."""
        if self._budget is None or not reasoning:
            return reasoning
        if self._reasoned >= self._budget:
            return ""
        self._reasoned += tokens
        return reasoning

    def answer_token(
        self, token: LogprobToken | None, text: str
    ) -> LogprobToken | None:
        """An upstream token that ended the reasoning and began the answer,
        reported as the answer's first token: its text and bytes cut to the
        content it wrote (``text``, released now, and what the stop matcher
        holds); its logprob and alternatives unchanged."""
        answer = text + self._stops.held
        at = -1 if token is None or not answer else token.token.rfind(answer)
        if token is None or at <= 0:  # no logprobs, or no text before its answer
            return token
        data = answer.encode()
        return dataclasses.replace(token, token=token.token[at:], token_bytes=data)

    def engine_splits(self) -> None:
        """The engine splits the reasoning itself (an upstream sent
        ``reasoning_content``): from now on its text is content, not split here
        (an upstream's plain answer is not reasoning for lack of an end marker,
        and its reasoning is not counted twice). The splitter's count is
        dropped; what it held goes out with the next ``feed``, in its channel.
        Nothing changes without a splitter, or when called again."""
        splitter = self._splitter
        if splitter is not None:
            self._splitter = None
            held = splitter.end_reasoning()
            self._held_split = (held.reasoning, held.content)

    def feed(self, text: str, tokens: int) -> ChoiceStep:
        """Take one step's ``text`` (standing for ``tokens`` tokens).

        Returns:
            ``ChoiceStep(text_safe_now)``, or ``ChoiceStep(text_before_stop,
            FinishReason.STOP)`` when a stop string completes; after that,
            ``ChoiceStep("")`` for every call (the text is dropped, not counted).

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        stops = self._stops
        if stops.finished:
            return ChoiceStep("")  # after a stop string: discarded, not counted
        self.completion_tokens += tokens
        reasoning = ""
        if self._splitter is not None:
            split = self._splitter.feed(text, tokens)
            reasoning, text = split.reasoning, split.content
        elif self._held_split is not None:
            (reasoning, held), self._held_split = self._held_split, None
            text = held + text
        step = stops.feed(text)
        if step.stop is not None:
            return ChoiceStep(step.text, FinishReason.STOP, reasoning)
        return ChoiceStep(step.text, None, reasoning)

    def flush(self) -> ChoiceStep:
        """End of the choice: what the stop matcher held (``""`` after a stop).

        Raises:
            LocalProtocolError: called twice.
        """
        stops = self._stops
        split = None if self._splitter is None else self._splitter.flush()
        if stops.finished:
            stops.flush()
            return ChoiceStep("")
        if split is None:
            return ChoiceStep(stops.flush())
        step = stops.feed(split.content)
        if step.stop is not None:
            stops.flush()
            return ChoiceStep(step.text, FinishReason.STOP, split.reasoning)
        return ChoiceStep(step.text + stops.flush(), None, split.reasoning)


def new_detokenizer(
    options: ChoiceOptions, vocabulary: Vocabulary, *, skip_special_tokens: bool
) -> IncrementalDetokenizer:
    """The detokenizer of one choice: the ids that end it never reach the text;
    other control tokens do only when ``skip_special_tokens`` is false (vLLM's
    meaning). An incomplete UTF-8 tail is dropped at the end."""
    ending = options.stop_token_ids
    if not options.ignore_eos:
        ending = ending | vocabulary.stop_ids if ending else vocabulary.stop_ids
    special = vocabulary.special_ids
    if not skip_special_tokens:
        skip = ending
    else:  # no copy of a large control-token set (Gemma 3 has 6,250)
        skip = special if ending <= special else ending | special
    return IncrementalDetokenizer(vocabulary.pieces, skip, drop_incomplete_tail=True)


class ChoiceDecoding(Protocol):
    """What both decoders share (``feed`` differs: token ids or text)."""

    @property
    def completion_tokens(self) -> int:
        """Tokens the choice has taken so far."""
        ...

    def flush(self) -> ChoiceStep:
        """End of the choice: the text held back."""
        ...

    @property
    def stop(self) -> str | None:
        """The stop string that matched, or ``None``."""
        ...


@dataclass(eq=False, slots=True)
class ChoiceState:
    """One choice of a response, as ``ResponseDecoder`` decodes it.

    Attributes:
        index: the choice's index (0-based).
        decoder: its ``ChoiceDecoder`` (token ids) or ``TextChoiceDecoder``.
        detokenizer: the decoder's detokenizer; ``None``: the engine yields text.
        echo: text sent before the engine's first token.
        aligner: cuts the text at token ends, with logprobs; else ``None``.
        finish_reason: how the choice ended (``None`` while open).
        engine_done: the engine ended it, or it was named to abort.
        read_done: nothing more is taken from this choice.
        released_chars: text the decoder has released (chars).
        text_aligner: cuts a text engine's text at its tokens' ends, with
            logprobs (a piece of text that came without them counts as one
            token of ``None``); else ``None``.
        engine_stop: the stop string the engine says it stopped on (a text
            engine's ``TextOutput.stop_sequence``), when the server's own
            matcher did not match one.
        held_logprobs: with logprobs and a reasoning splitter, the tokens whose
            text the splitter holds as a possible start marker: content tokens
            if the marker is ruled out, dropped if it opens the reasoning.
        held_tokens: ``held_logprobs`` of a text engine's choice.
    """

    index: int
    decoder: ChoiceDecoding
    detokenizer: IncrementalDetokenizer | None
    echo: str = ""
    aligner: LogprobAligner[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    engine_done: bool = False
    read_done: bool = False
    released_chars: int = 0
    engine_stop: str | None = None
    text_aligner: LogprobAligner[LogprobToken | None] | None = None
    held_logprobs: list[TokenLogprob] = field(default_factory=list)
    held_tokens: list[LogprobToken | None] = field(default_factory=list)


def new_choice(
    index: int,
    options: ChoiceOptions,
    vocabulary: Vocabulary | None,
    pattern: StopPattern,
    *,
    include_stop_str_in_output: bool,
    skip_special_tokens: bool,
    logprobs: bool,
    reasoning: ReasoningParser | None = None,
    reasoning_budget: int | None = None,
) -> ChoiceState:
    """Choice ``index`` of a response: a fresh stop matcher over ``pattern``, and
    for a token engine (``vocabulary`` given) its detokenizer and, with
    ``logprobs``, an aligner; with a ``reasoning`` parser that reasons, a
    ``ReasoningChoiceDecoder`` (its splitter before the stop matcher, the
    reasoning ended at ``reasoning_budget`` tokens when given)."""
    stops = StopMatcher(pattern, include_stop_str_in_output=include_stop_str_in_output)
    reasons = reasoning is not None and reasoning.reasons
    if vocabulary is None:
        splitter = ReasoningSplitter(reasoning) if reasoning and reasons else None
        text_decoder = TextChoiceDecoder(stops, splitter, reasoning_budget)
        choice = ChoiceState(index, text_decoder, None, options.echo)
        if logprobs:
            choice.text_aligner = LogprobAligner[LogprobToken | None]()
        return choice
    detokenizer = new_detokenizer(
        options, vocabulary, skip_special_tokens=skip_special_tokens
    )
    aligner = LogprobAligner[TokenLogprob]() if logprobs else None
    if reasoning is not None and reasons:
        splitter = ReasoningSplitter(reasoning)
        decoder: ChoiceDecoder = ReasoningChoiceDecoder(
            detokenizer, stops, splitter, reasoning_budget
        )
    else:
        decoder = ChoiceDecoder(detokenizer, stops)
    return ChoiceState(index, decoder, detokenizer, options.echo, aligner)
