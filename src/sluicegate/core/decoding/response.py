"""One response's engine outputs in, stream events out: every decision, no I/O.

``ResponseDecoder`` holds one response's choices. Its shell (``Generation``)
feeds it each item of each choice's engine sequence, writes the events ``feed``
returns, and aborts the sequences ``aborts`` and ``flush()`` name. Token ids go
through a ``ChoiceDecoder`` (detokenizer, stop matcher) and, with logprobs, a
``LogprobAligner`` (``LogprobDeltas``); a text engine's text (``TextOutput``)
only meets the stop matcher, its calls become ``Delta`` parts (``CallRule``).

Invariants:
    - Per choice, in order: ``Delta`` events, then exactly one ``Finish``; text
      held back by the stop matcher goes out before the ``Finish``.
    - With completions ``echo``, a choice's first ``Delta`` is its prompt's text
      (``start(index)``), before the engine's first token.
    - With logprobs, each ``Delta`` carries the tokens whose text it holds.
    - With a reasoning parser, a step's reasoning goes out as one ``Delta``
      whose ``parts`` hold it (``text`` empty), before the step's content
      ``Delta``; stop strings are matched on the content only.
    - When every choice has finished, one ``End`` carries the usage
      (``UsageTally``); with continuous usage, so does every event before it.
    - An engine failure, a sequence that ends without a finish reason, or one
      that had to call and did not, becomes one ``Fail`` event and no ``End``.
    - A stop string ends its choice at once: its index is appended to
      ``aborts`` (the engine sequence is still running); ``flush()`` names every
      sequence the engine has not ended. Each sequence is named once.
"""

from __future__ import annotations

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
from sluicegate.core.decoding.deltas import (
    ANY_CALLS,
    CallRule,
    CallTerms,
    LogprobDeltas,
    add_reasoning,
    add_text,
)
from sluicegate.core.decoding.reasoning import ReasoningParser
from sluicegate.core.decoding.stops import compile_stops
from sluicegate.core.decoding.usage import UsageTally
from sluicegate.core.errors import EngineError
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    Usage,
)

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
        calls: a text engine's ``CallTerms`` (``CallRule``): a choice that had
            to call (that function) and did not fails (``tool_call_missing``).

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
        "_calls",
        "_choices",
        "_clock",
        "_continuous_usage",
        "_flushed",
        "_logprobs",
        "_tally",
        "_text_decoders",
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
        calls: CallTerms = ANY_CALLS,
    ) -> None:
        if reasoning is not None and not reasoning.reasons:
            reasoning = None
        pattern = compile_stops(stops)  # once per response, shared by its choices
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
        # Typed views of the decoders, for the per-token paths: one kind is empty.
        self._token_decoders = [
            c.decoder for c in self._choices if isinstance(c.decoder, ChoiceDecoder)
        ]
        self._text_decoders = [
            c.decoder for c in self._choices if isinstance(c.decoder, TextChoiceDecoder)
        ]
        self._tally = UsageTally(
            self._choices, prompt_tokens, prompt_of, continuous=continuous_usage
        )
        pieces = () if vocabulary is None else vocabulary.pieces
        self._logprobs = LogprobDeltas(pieces, self._tally)
        self._continuous_usage = continuous_usage  # read once per token
        self._calls = CallRule(calls, len(choices))
        self._clock = clock
        self._unread = len(self._choices)
        self._flushed = False
        self.aborts: list[int] = []
        self.first_token_at: float | None = None

    @property
    def usage(self) -> Usage:
        """The usage so far (``UsageTally.usage``)."""
        return self._tally.usage

    @property
    def usage_estimated(self) -> bool:
        """Whether ``usage`` is an estimate (``UsageTally.estimated``)."""
        return self._tally.estimated

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
        (``UsageTally.report_prompt``)."""
        self._tally.report_prompt(prompt, tokens)

    def closed(self, index: int) -> bool:
        """Whether choice ``index`` takes nothing more (ended, or ``flush()``)."""
        return self._choices[index].read_done

    def start(self, index: int) -> Sequence[StreamEvent]:
        """The events of choice ``index`` before its engine's first item: its
        echo ``Delta``, or none."""
        choice = self._choices[index]
        if choice.read_done or not choice.echo:
            return _NO_EVENTS
        return [Delta(index, choice.echo, None, self._tally.so_far())]

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
                    self._tally.add_cached(index, item.cached_tokens)
                if choice.aligner is None:
                    # Once per token: the decoder, then the text (no logprobs).
                    step = self._token_decoders[index].feed(item.token_ids)
                    ongoing = step.finish_reason is None and item.finish_reason is None
                    if ongoing and not step.reasoning:
                        usage = self._tally.usage if self._continuous_usage else None
                        return step.events(index, usage)
                    events: list[StreamEvent] = []
                    add_reasoning(events, index, step.reasoning, self._tally)
                    add_text(events, index, step.text, self._tally)
                    if ongoing:
                        return events
                else:
                    events = []
                    decoder = self._token_decoders[index]
                    step = self._logprobs.feed_tokens(choice, decoder, item, events)
                    if step.finish_reason is None and item.finish_reason is None:
                        return events
                self._finish(choice, item.finish_reason, step, events)
            elif isinstance(item, TextOutput):
                if item.text and self.first_token_at is None:
                    self.first_token_at = self._clock()
                self._tally.count_prompt(index, item)
                aligned: list[StreamEvent] | None = None
                text_decoder = self._text_decoders[index]
                if item.reasoning:
                    text_decoder.engine_splits()
                if choice.text_aligner is None:
                    step = text_decoder.feed(item.text, item.completion_tokens)
                else:
                    aligned = []
                    step = self._logprobs.feed_text(choice, text_decoder, item, aligned)
                ongoing = step.finish_reason is None and item.finish_reason is None
                self._tally.count_reasoning(index, item)
                thought = text_decoder.within_budget(
                    item.reasoning + step.reasoning, item.completion_tokens
                )
                if aligned is None and ongoing and not item.tool_calls and not thought:
                    if not step.text:
                        return _NO_EVENTS
                    usage = self._tally.usage if self._continuous_usage else None
                    return (Delta(index, step.text, None, usage),)
                events = []
                add_reasoning(events, index, thought, self._tally)
                if aligned is None:
                    add_text(events, index, step.text, self._tally)
                else:
                    events += aligned
                cut = False
                if step.finish_reason is None:  # after a stop string: dropped
                    cut = self._calls.add(events, index, item.tool_calls, self._tally)
                if ongoing and not cut:
                    return events
                why = self._calls.failure(index, item.finish_reason)
                if why is not None:  # it had to call (that function) and did not
                    choice.engine_done = item.finish_reason is not None
                    events.append(Fail(why, code="tool_call_missing"))
                elif cut:  # a call past the limit: the choice ends before it
                    self.aborts.append(index)
                    reason = FinishReason.TOOL_CALLS if self._calls.most else None
                    self._finish(choice, reason or FinishReason.STOP, step, events)
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
            self._logprobs.flush(choice, "", events)
        else:
            assert engine_reason is not None, "called for a finished step"
            tail = choice.decoder.flush()
            add_reasoning(events, choice.index, tail.reasoning, self._tally)
            if choice.aligner is None and choice.text_aligner is None:
                add_text(events, choice.index, tail.text, self._tally)
            else:
                self._logprobs.flush(choice, tail.text, events)
            reason = tail.finish_reason or engine_reason
        choice.finish_reason = reason
        usage = self._tally.so_far()
        stop = choice.decoder.stop or choice.engine_stop
        events.append(Finish(choice.index, reason, usage, stop))
