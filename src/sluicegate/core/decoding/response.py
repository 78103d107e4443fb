"""One response's engine outputs in, stream events out: every decision, no I/O.

``ResponseDecoder`` holds the choices of one response. Its shell (the server's
``Generation``) feeds it each item of each choice's engine sequence as the engine
delivers it, writes the events ``feed`` returns, and asks the engine to abort the
sequences that ``aborts`` and ``flush()`` name. Per choice, token ids go through a
``ChoiceDecoder`` (detokenizer, then stop matcher) and, with logprobs, a
``LogprobAligner``; an engine that yields text (``TextOutput``) skips all token
work: its text only meets the stop matcher, and its tool-call fragments
(``TextOutput.tool_calls``, shaped by the engine) become ``Delta`` parts.

Invariants:
    - Per choice, in order: ``Delta`` events, then exactly one ``Finish``; text
      held back by the stop matcher goes out before the ``Finish``.
    - With completions ``echo``, a choice's first ``Delta`` is its prompt's text
      (``start(index)``), before the engine's first token.
    - With logprobs, each ``Delta`` carries the tokens whose text it holds:
      text is then cut at token boundaries.
    - With a reasoning parser, a step's reasoning goes out as one ``Delta``
      whose ``parts`` hold it (``text`` empty), before the step's content
      ``Delta``; stop strings are matched on the content only.
    - When every choice has finished, one ``End`` carries the usage: each prompt
      once, completion tokens summed over choices. A prompt's latest count and
      cached part, as an engine reports them (``TextOutput.prompt_tokens``,
      ``cached_tokens``), are added once, whichever choice reported them. With
      continuous usage, every ``Delta`` and ``Finish`` carries the usage so far.
    - An engine failure, or a sequence that ends without a finish reason,
      becomes one ``Fail`` event and no ``End``.
    - A stop string ends its choice at once: its index is appended to
      ``aborts`` (the engine sequence is still running); ``flush()`` names every
      sequence the engine has not ended. Each sequence is named once.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.choice_setup import (
    ChoiceOptions,
    ChoiceState,
    TextChoiceDecoder,
    Vocabulary,
    new_choice,
)
from sluicegate.core.decoding.reasoning import ReasoningParser, ReasoningPhase
from sluicegate.core.decoding.reasoning_choice import ReasoningChoiceDecoder
from sluicegate.core.decoding.stops import compile_stops
from sluicegate.core.errors import EngineError
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    TokenLogprob,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.logprobs import AlignedStep, LogprobToken, describe_logprob

__all__ = [
    "ENDED_WITHOUT_FINISH",
    "ChoiceOptions",
    "OutputItem",
    "ResponseDecoder",
    "Vocabulary",
]

OutputItem = EngineOutput | TextOutput | EngineError | None
"""An engine sequence's output (token ids or text), failure, or ``None`` (ended)."""

ENDED_WITHOUT_FINISH = "The engine ended a sequence without a finish reason"
"""The in-band error of a sequence that ended without a finish reason."""
_NO_EVENTS: tuple[StreamEvent, ...] = ()


class ResponseDecoder:
    """The choices of one response: engine items in, stream events out.

    Args:
        choices: one ``ChoiceOptions`` per choice, in index order (>= 1).
        vocabulary: the engine's tokenizer when it yields token ids; ``None``
            when it yields text (``TextOutput``): no token work is done.
        prompt_tokens: the response's prompt tokens, each prompt once (tokens);
            for a text engine, those it does not count itself (usually 0).
        prompt_of: the prompt index of each choice, for the engine's prompt
            counts and cached parts; ``None``: every choice continues one prompt.
        stops: stop strings, matched on each choice's text.
        include_stop_str_in_output: end the text with the matched stop string.
        skip_special_tokens: keep control tokens out of the text (the token
            that ends a choice stays out either way).
        logprobs: give each ``Delta`` the logprobs of its tokens.
        continuous_usage: put the usage so far on every ``Delta`` and ``Finish``.
        clock: Unix time in seconds, read once, at the first token.
        reasoning: the request's reasoning markers (``request_reasoning``), or
            ``None``: no reasoning channel. With one, a token engine's text is
            split (``ReasoningChoiceDecoder``): reasoning goes out as ``Delta``
            parts before the content, and the usage counts reasoning tokens;
            with ``logprobs``, only content tokens carry them.
        reasoning_budget: reasoning tokens the server enforces: a token
            engine's reasoning ends there (the rest is content), a text engine's
            is cut (``TextChoiceDecoder.within_budget``); or ``None``.

    Raises:
        ValueError: ``logprobs`` without a ``vocabulary`` (text has no tokens).

    Attributes:
        aborts: indices of choices a stop string ended while their engine
            sequences still run, oldest first. The caller aborts those sequences
            and empties the list; ``feed`` only appends.
        first_token_at: ``clock()`` when the first token (or text) arrived, or
            ``None``.
    """

    __slots__ = (
        "_choices",
        "_clock",
        "_continuous_usage",
        "_counted",
        "_flushed",
        "_max_calls",
        "_pieces",
        "_prompt_of",
        "_prompt_tokens",
        "_reasoning",
        "_reported_prompts",
        "_text_decoders",
        "_text_reasoning",
        "_text_splitters",
        "_token_decoders",
        "_unread",
        "aborts",
        "first_token_at",
    )

    def __init__(
        self,
        choices: Sequence[ChoiceOptions],
        vocabulary: Vocabulary | None,
        *,
        prompt_tokens: int,
        prompt_of: Sequence[int] | None = None,
        stops: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        logprobs: bool = False,
        continuous_usage: bool = False,
        clock: Callable[[], float] = time.time,
        reasoning: ReasoningParser | None = None,
        reasoning_budget: int | None = None,
        max_tool_calls: int | None = None,
    ) -> None:
        if reasoning is not None and not reasoning.reasons:
            reasoning = None
        pattern = compile_stops(stops)  # once per response, shared by its choices
        self._pieces: Sequence[bytes] = () if vocabulary is None else vocabulary.pieces
        self._choices = [
            new_choice(
                index,
                options,
                vocabulary,
                pattern,
                include_stop_str_in_output=include_stop_str_in_output,
                skip_special_tokens=skip_special_tokens,
                logprobs=logprobs,
                reasoning=reasoning,
                reasoning_budget=reasoning_budget,
            )
            for index, options in enumerate(choices)
        ]
        self._reasoning = [
            c.decoder
            for c in self._choices
            if isinstance(c.decoder, ReasoningChoiceDecoder)
        ]
        # Typed views of the decoders, for the per-token paths: one kind is empty.
        self._token_decoders = [
            c.decoder for c in self._choices if isinstance(c.decoder, ChoiceDecoder)
        ]
        self._text_decoders = [
            c.decoder for c in self._choices if isinstance(c.decoder, TextChoiceDecoder)
        ]
        self._text_splitters = [d for d in self._text_decoders if d.splits]
        self._prompt_tokens = prompt_tokens
        self._prompt_of = prompt_of
        # prompt index -> (its tokens, those read from a cache)
        self._reported_prompts: dict[int, tuple[int, int]] = {}
        self._counted: set[int] = set()  # text choices the engine ended counting
        # text choice -> reasoning tokens (steps with reasoning, or the engine's count)
        self._text_reasoning: dict[int, int] = {}
        self._continuous_usage = continuous_usage  # read once per token
        self._max_calls = max_tool_calls
        self._clock = clock
        self._unread = len(self._choices)
        self._flushed = False
        self.aborts: list[int] = []
        self.first_token_at: float | None = None

    @property
    def usage(self) -> Usage:
        """Prompt tokens once, completion tokens taken summed over choices; with
        a reasoning channel, the reasoning tokens among them."""
        completion = sum(c.decoder.completion_tokens for c in self._choices)
        reported = self._reported_prompts.values()
        prompt = self._prompt_tokens + sum(tokens for tokens, _ in reported)
        cached = sum(cached for _, cached in reported)
        if not (self._reasoning or self._text_reasoning or self._text_splitters):
            return Usage(prompt, completion, cached)
        reasoning = sum(d.reasoning_tokens for d in self._reasoning)
        reasoning += sum(self._text_reasoning.values())
        reasoning += sum(d.reasoning_tokens for d in self._text_splitters)
        return Usage(prompt, completion, cached, reasoning_tokens=reasoning)

    @property
    def usage_estimated(self) -> bool:
        """Whether ``usage`` is an estimate: a text engine did not end every
        choice with its own counts (a choice cut short by the client, an error
        or a stop string matched here; or an engine that never reports the
        prompt's tokens). Token engines' usage is always exact."""
        return not self._token_decoders and len(self._counted) < len(self._choices)

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """Each choice's finish reason, by index (``None`` while open)."""
        return tuple(c.finish_reason for c in self._choices)

    @property
    def stop_sequences(self) -> tuple[str | None, ...]:
        """Each choice's matched stop string, by index (``None`` for none)."""
        return tuple(c.decoder.stop or c.engine_stop for c in self._choices)

    def report_prompt(self, prompt: int, tokens: int) -> None:
        """Prompt ``prompt``'s tokens as counted before its engine said them
        (an upstream's tokenizer); the engine's last output's count replaces
        this, and one it already gave stays."""
        self._reported_prompts.setdefault(prompt, (tokens, 0))

    def closed(self, index: int) -> bool:
        """Whether choice ``index`` takes nothing more (ended, or ``flush()``)."""
        return self._choices[index].read_done

    def start(self, index: int) -> Sequence[StreamEvent]:
        """The events of choice ``index`` before its engine's first item: its
        echo ``Delta``, or none."""
        choice = self._choices[index]
        if choice.read_done or not choice.echo:
            return _NO_EVENTS
        return [Delta(index, choice.echo, None, self._usage_so_far())]

    def feed(self, index: int, item: OutputItem) -> Sequence[StreamEvent]:
        """Take one item of choice ``index``'s engine sequence.

        Args:
            index: the choice (0-based).
            item: its next ``EngineOutput`` (or ``TextOutput`` for a text
                engine), its ``EngineError``, or ``None`` when the sequence ended
                without a finish reason.

        Returns:
            The events to send now, in order (often none, mostly one ``Delta``):
            ``Delta`` events; on the choice's last item, its ``Finish`` (and the
            ``End`` after the last choice); ``Fail`` for an error. Nothing for an
            item after the choice ended or after ``flush()``.

        Raises:
            ValueError: a token id outside the vocabulary (a bug of the engine).
        """
        choice = self._choices[index]
        if choice.read_done:
            return _NO_EVENTS  # after a stop string, a failure or flush()
        try:
            if isinstance(item, EngineOutput):
                if item.token_ids and self.first_token_at is None:
                    self.first_token_at = self._clock()
                if item.cached_tokens:  # a token engine's reused prompt part
                    prompt = 0 if self._prompt_of is None else self._prompt_of[index]
                    self._reported_prompts[prompt] = (0, item.cached_tokens)
                if choice.aligner is None:
                    # Once per token: the decoder, then the text (no logprobs).
                    step = self._token_decoders[index].feed(item.token_ids)
                    ongoing = step.finish_reason is None and item.finish_reason is None
                    if ongoing and not step.reasoning:
                        if not step.text:
                            return _NO_EVENTS
                        usage = self.usage if self._continuous_usage else None
                        return (Delta(index, step.text, None, usage),)
                    events: list[StreamEvent] = []
                    self._reasoning_delta(choice, step.reasoning, events)
                    self._delta(choice, step.text, None, events)
                    if ongoing:
                        return events
                else:
                    events = []
                    step = self._feed_with_logprobs(choice, item, events)
                    if step.finish_reason is None and item.finish_reason is None:
                        return events
                self._finish(choice, item.finish_reason, step, events)
            elif isinstance(item, TextOutput):
                if item.text and self.first_token_at is None:
                    self.first_token_at = self._clock()
                if item.prompt_tokens is not None:
                    prompt_of = self._prompt_of
                    prompt = 0 if prompt_of is None else prompt_of[index]
                    said = (item.prompt_tokens, item.cached_tokens)
                    if item.finish_reason is not None:  # the engine's last word
                        self._counted.add(index)
                        self._reported_prompts[prompt] = said
                    else:  # a count said before (a tokenizer's) stays
                        self._reported_prompts.setdefault(prompt, said)
                aligned: list[StreamEvent] | None = None
                if choice.text_aligner is None:
                    text_decoder = self._text_decoders[index]
                    step = text_decoder.feed(item.text, item.completion_tokens)
                else:
                    aligned = []
                    step = self._feed_text_with_logprobs(choice, item, aligned)
                ongoing = step.finish_reason is None and item.finish_reason is None
                thought = self._count_reasoning(index, item, step.reasoning)
                if aligned is None and ongoing and not item.tool_calls and not thought:
                    if not step.text:
                        return _NO_EVENTS
                    usage = self.usage if self._continuous_usage else None
                    return (Delta(index, step.text, None, usage),)
                events = []
                self._reasoning_delta(choice, thought, events)
                if aligned is None:
                    self._delta(choice, step.text, None, events)
                else:
                    events += aligned
                cut = False
                if step.finish_reason is None:  # after a stop string: dropped
                    cut = self._tool_calls(index, item.tool_calls, events)
                if cut:  # a call past max_tool_calls: the choice ends before it
                    self.aborts.append(index)
                    self._finish(choice, FinishReason.TOOL_CALLS, step, events)
                elif ongoing:
                    return events
                else:
                    if item.finish_reason is FinishReason.STOP:
                        choice.engine_stop = item.stop_sequence
                    self._finish(choice, item.finish_reason, step, events)
            elif item is None:
                choice.engine_done = True
                events = [Fail(ENDED_WITHOUT_FINISH)]
            else:
                raise item
        except EngineError as exc:
            choice.engine_done = True
            events = [Fail(str(exc) or type(exc).__name__, code=exc.code)]
        self._read(choice, events)
        return events

    def fail(self, index: int, message: str, code: str) -> Sequence[StreamEvent]:
        """Choice ``index`` failed outside the engine (a bug met while reading it).

        Returns:
            ``Fail(message, code=code)``; nothing after ``flush()``. The choice's
            engine sequence stays unended: ``flush()`` names it.
        """
        if self._flushed:
            return _NO_EVENTS
        events: list[StreamEvent] = [Fail(message, code=code)]
        choice = self._choices[index]
        if not choice.read_done:
            self._read(choice, events)
        return events

    def flush(self) -> tuple[int, ...]:
        """End the response: nothing more is taken from any choice.

        Returns:
            The indices of the choices whose engine sequences have not ended
            (and were not named in ``aborts``): the caller aborts them. Later
            calls return ``()``.
        """
        if self._flushed:
            return ()
        self._flushed = True
        unended = []
        for choice in self._choices:
            choice.read_done = True
            if not choice.engine_done:
                choice.engine_done = True
                unended.append(choice.index)
        return tuple(unended)

    def _read(self, choice: ChoiceState, events: list[StreamEvent]) -> None:
        """``choice`` is read to its end; after the last one, ``End``."""
        choice.read_done = True
        self._unread -= 1
        if self._unread == 0 and all(c.finish_reason for c in self._choices):
            events.append(End(self.usage))

    def _finish(
        self,
        choice: ChoiceState,
        engine_reason: FinishReason | None,
        step: ChoiceStep,
        events: list[StreamEvent],
    ) -> None:
        """The step ended the choice (a stop string, or the engine's finish
        reason): abort or flush as that needs, then the choice's ``Finish``."""
        reason = step.finish_reason
        choice.engine_done = True
        if reason is not None:
            # A stop string matched: the engine must stop now; what follows drops.
            self.aborts.append(choice.index)
            self._flush_aligner(choice, "", events)
        else:
            assert engine_reason is not None, "called for a finished step"
            tail = choice.decoder.flush()
            self._reasoning_delta(choice, tail.reasoning, events)
            if choice.aligner is None and choice.text_aligner is None:
                self._delta(choice, tail.text, None, events)
            else:
                if tail.text and choice.held_logprobs:
                    self._release_held(choice)  # a held start marker was text
                self._flush_aligner(choice, tail.text, events)
            reason = tail.finish_reason or engine_reason
        choice.finish_reason = reason
        usage = self._usage_so_far()
        stop = choice.decoder.stop or choice.engine_stop
        events.append(Finish(choice.index, reason, usage, stop))

    def _feed_with_logprobs(
        self, choice: ChoiceState, output: EngineOutput, events: list[StreamEvent]
    ) -> ChoiceStep:
        """The step's tokens one by one through the decoder and the aligner."""
        decoder, aligner = self._token_decoders[choice.index], choice.aligner
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
                # Logprobs are the content's (OpenAI's reasoning models give
                # none for their reasoning): a token spent inside the reasoning
                # carries none; the one that ends it carries its content.
                self._reasoning_delta(choice, step.reasoning, events)
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

    def _release_held(self, choice: ChoiceState) -> None:
        """The tokens held as a possible start marker are content after all:
        into the aligner, their ends with the text that releases them."""
        aligner = choice.aligner
        assert aligner is not None, "held logprobs come with an aligner"
        for held in choice.held_logprobs:
            aligner.feed("", held, None)
        choice.held_logprobs.clear()

    def _flush_aligner(
        self, choice: ChoiceState, text: str, events: list[StreamEvent]
    ) -> None:
        if choice.aligner is not None:
            aligned = choice.aligner.flush(text)
            self._delta(choice, aligned.text, aligned.tokens, events)
        elif choice.text_aligner is not None:
            self._text_delta(choice, choice.text_aligner.flush(text), events)

    def _feed_text_with_logprobs(
        self, choice: ChoiceState, item: TextOutput, events: list[StreamEvent]
    ) -> ChoiceStep:
        """A text engine's step, token by token (each with its part of the text)
        through the stop matcher and the aligner (text without tokens: one piece)."""
        aligner, decoder = choice.text_aligner, self._text_decoders[choice.index]
        assert aligner is not None, "called for a choice with logprobs"
        tokens = item.logprobs
        texts = item.token_texts or tuple(t.token for t in tokens or ())
        pieces: list[tuple[str, LogprobToken | None]] = [(item.text, None)]
        if tokens and "".join(texts) == item.text:
            pieces = list(zip(texts, tokens, strict=True))
        step, count = ChoiceStep(""), item.completion_tokens
        reasoning = ""  # a splitter's (the upstream's own comes apart)
        for text, token in pieces:
            content = decoder.in_content
            step, count = decoder.feed(text, count), 0
            reasoning += step.reasoning
            if not content and not step.text:
                continue  # a reasoning token (or marker): logprobs are the content's
            if not content:  # it ended the reasoning: its content part only
                token = decoder.answer_token(token, step.text)
            choice.released_chars += len(step.text)
            end: int | None = choice.released_chars + len(decoder.held)
            if step.finish_reason is not None:
                end = None  # it completed a stop string
            self._text_delta(choice, aligner.feed(step.text, token, end), events)
            if step.finish_reason is not None:
                break
        return ChoiceStep(step.text, step.finish_reason, reasoning)

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
        events.append(Delta(choice.index, aligned.text, logprobs, self._usage_so_far()))

    def _delta(
        self,
        choice: ChoiceState,
        text: str,
        tokens: tuple[tuple[TokenLogprob, int], ...] | None,
        events: list[StreamEvent],
    ) -> None:
        """Append a ``Delta`` of ``text`` (with its tokens' logprobs) if any."""
        if not text and not tokens:
            return
        logprobs = None
        if tokens is not None:
            offset, pieces = len(choice.echo), self._pieces
            logprobs = tuple(
                describe_logprob(pieces, logprob, offset + start)
                for logprob, start in tokens
            )
        events.append(Delta(choice.index, text, logprobs, self._usage_so_far()))

    def _count_reasoning(self, index: int, item: TextOutput, split: str) -> str:
        """A text engine's step counted (its own count, else the tokens of steps
        with reasoning); its reasoning, then ``split``, within the budget."""
        if item.reasoning or item.reasoning_tokens is not None:
            own = item.reasoning_tokens
            if own is None:
                own = self._text_reasoning.get(index, 0) + item.completion_tokens
            self._text_reasoning[index] = own
        thought = item.reasoning + split
        return self._text_decoders[index].within_budget(thought, item.completion_tokens)

    def _reasoning_delta(
        self, choice: ChoiceState, text: str, events: list[StreamEvent]
    ) -> None:
        """Append a ``Delta`` of reasoning ``text`` (no content) if any."""
        if text:
            parts = DeltaParts(reasoning=text)
            events.append(Delta(choice.index, "", None, self._usage_so_far(), parts))

    def _tool_calls(
        self,
        index: int,
        fragments: tuple[ToolCallFragment, ...],
        events: list[StreamEvent],
    ) -> bool:
        """One ``Delta`` per fragment of a text engine's calls. True, with the
        fragments before it, at the first fragment of a call past
        ``max_tool_calls`` (the calls before it are whole, in order)."""
        limit = self._max_calls
        for fragment in fragments:
            if limit is not None and fragment.index >= limit:
                return True
            parts = DeltaParts((fragment,))
            events.append(Delta(index, "", None, self._usage_so_far(), parts))
        return False

    def _usage_so_far(self) -> Usage | None:
        return self.usage if self._continuous_usage else None
