"""One response's engine sequences, read into an outbox of stream events.

``Generation`` starts one engine sequence per choice and reads each one as fast as
the engine produces: every step goes through that choice's ``ChoiceDecoder`` and
comes out as ``Delta``/``Finish`` events in an ``Outbox``. An engine that returns
``SequenceOutputs`` is listened to: each step is decoded in the engine's own
callback, with no task in between (a task per choice reads any other async
iterator). Whoever writes to the client drains the outbox at its own
pace, so the engine never waits on a client. No HTTP here: ``streaming.py`` races
the writers against the client's disconnect.

Invariants:
    - Per choice, in order: ``Delta`` events, then exactly one ``Finish``; text
      held back by the stop matcher goes out before the ``Finish``.
    - With completions ``echo``, a choice's first ``Delta`` is its prompt's text,
      sent before the engine's first token.
    - With logprobs, each ``Delta`` carries the tokens whose text it holds
      (``LogprobAligner``): text is then cut at token boundaries.
    - When every choice has finished, one ``End`` carries the usage: each prompt
      once, completion tokens summed over choices. With continuous usage, every
      ``Delta`` and ``Finish`` also carries the usage so far.
    - An engine failure becomes one ``Fail`` event and no ``End``; so does a
      bug met while decoding a step (``internal_error``, traceback logged).
    - A stop string aborts that engine sequence at once; ``abort_unfinished()``
      aborts every sequence the engine has not ended (disconnect, error, cancel).

Spec: ../shared/DESIGN.md, "Engine protocol" and "Stop strings".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from sluicegate.core.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.detokenize import IncrementalDetokenizer
from sluicegate.core.errors import EngineError
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    TokenLogprob,
    Usage,
)
from sluicegate.core.logprobs import (
    LogprobAligner,
    LogprobToken,
    TopLogprob,
    describe_token,
)
from sluicegate.core.stops import StopMatcher, StopPattern, compile_stops
from sluicegate.engines.base import Engine
from sluicegate.engines.outputs import OutputItem, SequenceOutputs
from sluicegate.server.prepare import Plan

__all__ = ["INTERNAL_ERROR_MESSAGE", "Generation", "Outbox"]

logger = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = "The server failed while streaming this response"
"""The in-band error of a bug: the details stay in the server's log."""


class Outbox:
    """Events from the choice readers to one writer; ``put`` never blocks.

    Unbounded: ``StreamBuffer`` (``buffer.py``) is the bounded, coalescing one
    that streams use. asyncio only: it runs once per token per stream, and a bare
    future is the cheapest wake-up there is.
    """

    def __init__(self) -> None:
        self._events: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # Asked once, not per wait: get_running_loop() is a getpid system call
        # in CPython 3.11, and the writer waits once per token.
        self._loop: asyncio.AbstractEventLoop | None = None

    def put(self, event: StreamEvent) -> None:
        """Queue ``event`` and wake the writer."""
        self._events.append(event)
        self.poke()

    def poke(self) -> None:
        """Wake the writer, whether or not anything is queued."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def drain(self) -> list[StreamEvent]:
        """Every queued event, oldest first (``[]`` when none)."""
        events = list(self._events)
        self._events.clear()
        return events

    async def wait(self, timeout_s: float = math.inf) -> None:
        """Return when an event is queued, ``poke()`` is called, or after
        ``timeout_s`` seconds (``math.inf``: no time limit)."""
        if self._events or timeout_s <= 0:
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None
        if timeout_s != math.inf:
            timer = loop.call_later(timeout_s, _wake, waiter)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


@dataclass(eq=False, slots=True)
class _Choice:
    index: int
    sequence_id: str
    decoder: ChoiceDecoder
    detokenizer: IncrementalDetokenizer
    echo: str = ""
    aligner: LogprobAligner[TokenLogprob] | None = None
    outputs: AsyncIterator[EngineOutput] | None = None
    finish_reason: FinishReason | None = None
    engine_done: bool = False  # the engine ended this sequence: no abort needed
    read_done: bool = False  # nothing more is read from this choice
    released_chars: int = 0  # text the decoder has released (chars)


class Generation:
    """The ``n`` engine sequences of one response and their decoders.

    Args:
        engine: the engine to run on.
        plan: the checked request (prompt ids, params, stop strings, ``n``).
    """

    def __init__(self, engine: Engine, plan: Plan) -> None:
        self._engine = engine
        self._plan = plan
        self._pieces = engine.tokenizer.pieces
        stops = compile_stops(plan.stops)  # once per request, shared by its choices
        self._choices = [
            self._new_choice(index, sequence_id, stops)
            for index, sequence_id in enumerate(plan.sequence_ids)
        ]
        self.first_token_at: float | None = None
        """Unix time (seconds) the first token id arrived, or ``None``."""
        self._continuous_usage = plan.continuous_usage  # read once per token
        self._outbox = Outbox()  # where attach() puts events
        self._unread = 0  # choices still read
        self._readers: list[asyncio.Task[None]] = []  # for plain async iterators

    @property
    def usage(self) -> Usage:
        """Prompt tokens once, completion tokens received summed over choices."""
        completion = sum(c.decoder.completion_tokens for c in self._choices)
        return Usage(self._plan.prompt_tokens, completion)

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """Each choice's finish reason, by index (``None`` while open)."""
        return tuple(c.finish_reason for c in self._choices)

    @property
    def wants_logprobs(self) -> bool:
        """Whether the request asked for logprobs (each ``Delta`` then has them)."""
        return self._plan.logprobs is not None

    def start(self) -> None:
        """Submit every choice to the engine, before any byte is sent.

        Raises:
            EngineError: an engine that refuses at once (``EngineUnavailable`` for
                a full queue); the choices already submitted are aborted.
        """
        try:
            for choice, request in zip(
                self._choices, self._plan.requests(), strict=True
            ):
                choice.outputs = self._engine.generate(request)
        finally:
            if any(c.outputs is None for c in self._choices):
                self.abort_unfinished()

    def attach(self, outbox: Outbox) -> None:
        """Read every choice into ``outbox`` from now on, without blocking.

        Each choice's events go to ``outbox`` as the engine produces them; when
        the last choice has finished, one ``End`` follows. An engine failure is a
        ``Fail``; so is a bug met while decoding a step (logged with its
        traceback, then ``internal_error``). Call ``detach()`` when the response
        ends, then ``abort_unfinished()``.
        """
        assert self._unread == 0, "attach() once"
        self._outbox = outbox
        self._unread = len(self._choices)
        for choice in self._choices:
            outputs = choice.outputs
            assert outputs is not None, "start() before attach()"
            if choice.echo:
                self._put(choice, outbox, choice.echo, None)
            if isinstance(outputs, SequenceOutputs):
                outputs.listen(functools.partial(self._on_item, choice))
            else:
                reader = asyncio.get_running_loop().create_task(
                    self._read(choice, outputs)
                )
                self._readers.append(reader)

    def detach(self) -> None:
        """Stop reading: nothing more goes to the outbox. Safe to call repeatedly."""
        for reader in self._readers:
            reader.cancel()  # each closes its iterator as it ends
        for choice in self._choices:
            choice.read_done = True
            if isinstance(choice.outputs, SequenceOutputs):
                choice.outputs.close()

    def abort_unfinished(self) -> None:
        """Abort every sequence the engine has not ended; safe to call repeatedly."""
        for choice in self._choices:
            if not choice.engine_done:
                choice.engine_done = True
                self._engine.abort(choice.sequence_id)

    async def _read(
        self, choice: _Choice, outputs: AsyncIterator[EngineOutput]
    ) -> None:
        """Feed an engine's plain async iterator to ``_on_item`` (no listener)."""
        try:
            async for output in outputs:
                self._on_item(choice, output)
                if choice.read_done:
                    return
            self._on_item(choice, None)
        except EngineError as exc:
            self._on_item(choice, exc)
        except Exception:  # the reader task's outermost frame: a bug
            self._fail_internal(choice)
        finally:
            await asyncio.shield(_aclose(outputs))

    def _on_item(self, choice: _Choice, item: OutputItem) -> None:
        """One item of a choice's engine sequence, decoded into the outbox.

        The outermost frame of the engine's callback: a bug here must not reach
        the engine's loop, so it becomes this response's ``internal_error``.
        """
        if choice.read_done:
            return  # after our own abort (a stop string), or a failure
        outbox = self._outbox
        try:
            if isinstance(item, EngineOutput):
                if item.token_ids and self.first_token_at is None:
                    self.first_token_at = time.time()
                if choice.aligner is None:
                    # Once per token: the decoder, then the text (no logprobs).
                    step = choice.decoder.feed(item.token_ids)
                    if step.text:
                        usage = self.usage if self._continuous_usage else None
                        outbox.put(Delta(choice.index, step.text, None, usage))
                else:
                    step = self._feed_with_logprobs(choice, item, outbox)
                if step.finish_reason is None and item.finish_reason is None:
                    return  # the choice goes on (most steps)
                self._finish(choice, item, step, outbox)
            elif item is None:
                choice.engine_done = True
                outbox.put(Fail("The engine ended a sequence without a finish reason"))
            else:
                raise item
        except EngineError as exc:
            choice.engine_done = True
            outbox.put(Fail(str(exc) or type(exc).__name__, code=exc.code))
        except Exception:  # see the docstring: log it, fail this response
            self._fail_internal(choice)
            return
        self._read_one(choice)

    def _fail_internal(self, choice: _Choice) -> None:
        logger.exception("reading sequence %s failed", choice.sequence_id)
        self._outbox.put(Fail(INTERNAL_ERROR_MESSAGE, code="internal_error"))
        self._read_one(choice)

    def _read_one(self, choice: _Choice) -> None:
        """``choice`` is read to its end; after the last one, ``End``."""
        choice.read_done = True
        self._unread -= 1
        if self._unread == 0 and all(
            c.finish_reason is not None for c in self._choices
        ):
            self._outbox.put(End(self.usage))

    def _new_choice(
        self, index: int, sequence_id: str, stop_pattern: StopPattern
    ) -> _Choice:
        plan, tokenizer = self._plan, self._engine.tokenizer
        choice_plan = plan.choices[index]
        params = choice_plan.params
        # The token that ends a choice never reaches the text; other control
        # tokens do when skip_special_tokens is false (vLLM's meaning).
        ending = params.stop_token_ids
        if not params.ignore_eos:
            ending = ending | tokenizer.stop_ids if ending else tokenizer.stop_ids
        special = tokenizer.special_ids
        if not plan.skip_special_tokens:
            skip = ending
        else:  # no copy of a large control-token set (Gemma 3 has 6,250)
            skip = special if ending <= special else ending | special
        stops = StopMatcher(
            stop_pattern, include_stop_str_in_output=plan.include_stop_str_in_output
        )
        aligner = None if plan.logprobs is None else LogprobAligner[TokenLogprob]()
        detokenizer = IncrementalDetokenizer(
            tokenizer.pieces, skip, drop_incomplete_tail=True
        )
        decoder = ChoiceDecoder(detokenizer, stops)
        return _Choice(
            index, sequence_id, decoder, detokenizer, choice_plan.echo, aligner
        )

    def _finish(
        self, choice: _Choice, output: EngineOutput, step: ChoiceStep, outbox: Outbox
    ) -> None:
        """The step ended the choice (a stop string, or the engine's finish
        reason): abort or flush as that needs, then the choice's ``Finish``."""
        reason = step.finish_reason
        if reason is not None:
            # A stop string matched: stop the engine now, drop what follows.
            self._engine.abort(choice.sequence_id)
            choice.engine_done = True
            self._flush_aligner(choice, "", outbox)
        else:
            assert output.finish_reason is not None, "called for a finished step"
            choice.engine_done = True
            tail = choice.decoder.flush()
            if choice.aligner is None:
                self._put(choice, outbox, tail.text, None)
            else:
                self._flush_aligner(choice, tail.text, outbox)
            reason = tail.finish_reason or output.finish_reason
        choice.finish_reason = reason
        outbox.put(Finish(choice.index, reason, self._usage_so_far()))

    def _feed_with_logprobs(
        self, choice: _Choice, output: EngineOutput, outbox: Outbox
    ) -> ChoiceStep:
        """The step's tokens one by one through the decoder and the aligner."""
        decoder, aligner = choice.decoder, choice.aligner
        assert aligner is not None, "a choice with logprobs has an aligner"
        logprobs = output.logprobs or ()
        if len(logprobs) != len(output.token_ids):
            raise EngineError(f"expected one logprob per token id; got {output!r}")
        step = ChoiceStep("")
        for token_id, logprob in zip(output.token_ids, logprobs, strict=True):
            step = decoder.feed((token_id,))
            choice.released_chars += len(step.text)
            end: int | None = choice.released_chars + len(decoder.held)
            if choice.detokenizer.pending_bytes or step.finish_reason is not None:
                end = None  # the token's text is incomplete, or it hit a stop
            aligned = aligner.feed(step.text, logprob, end)
            self._put(choice, outbox, aligned.text, aligned.tokens)
            if step.finish_reason is not None:
                break
        return step

    def _flush_aligner(self, choice: _Choice, text: str, outbox: Outbox) -> None:
        if choice.aligner is not None:
            aligned = choice.aligner.flush(text)
            self._put(choice, outbox, aligned.text, aligned.tokens)

    def _put(
        self,
        choice: _Choice,
        outbox: Outbox,
        text: str,
        tokens: tuple[tuple[TokenLogprob, int], ...] | None,
    ) -> None:
        """Queue a ``Delta`` of ``text`` (with its tokens' logprobs) if non-empty."""
        if not text and not tokens:
            return
        logprobs = None
        if tokens is not None:
            offset = len(choice.echo)
            logprobs = tuple(
                self._describe(logprob, offset + start) for logprob, start in tokens
            )
        usage = self._usage_so_far()
        outbox.put(Delta(choice.index, text, logprobs, usage))

    def _describe(self, logprob: TokenLogprob, text_offset: int) -> LogprobToken:
        pieces = self._pieces
        token, data = describe_token(pieces, logprob.token_id)
        top = tuple(
            TopLogprob(*describe_token(pieces, token_id), value)
            for token_id, value in logprob.top
        )
        return LogprobToken(token, data, logprob.logprob, text_offset, top)

    def _usage_so_far(self) -> Usage | None:
        return self.usage if self._continuous_usage else None


async def _aclose(outputs: AsyncIterator[EngineOutput]) -> None:
    aclose = getattr(outputs, "aclose", None)
    if aclose is not None:
        await aclose()
