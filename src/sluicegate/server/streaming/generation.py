"""One response's engine sequences, read into an outbox of stream events.

``Generation`` is the thin shell around a ``ResponseDecoder``
(``core/decoding/response.py``, where every decision is made): it starts one engine
sequence per choice, feeds each item the engine delivers to the decoder, puts the events
it returns into an ``Outbox``, and aborts the sequences the decoder names. The outputs
of an engine that declares them ``ListenableOutputs`` (``Capabilities.listenable``, the
engine protocol's delivery contract) are listened to: each item is decoded in the
engine's own callback, with no task in between; a task per choice reads any other
engine's async iterators. Whoever writes to the client drains the outbox at its own
pace, so the engine never waits on a client. No HTTP here: the responses
(``sse_response.py``, ``json_response.py``) race their writing against the client's
disconnect (``disconnect.py``).

Invariants (besides the decoder's):
    - A bug met while decoding a step (or in the outbox) becomes that response's
      ``Fail`` (``internal_error``), with its traceback logged; it never reaches
      the engine's loop.
    - A stop string aborts its engine sequence before the events of that step
      are put; ``abort_unfinished()`` aborts every sequence the engine has not
      ended (disconnect, error, cancel).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from sluicegate.core.decoding.response import ChoiceOptions, OutputItem
from sluicegate.core.decoding.tooldecoder import new_response_decoder
from sluicegate.core.errors import EngineError, RequestError
from sluicegate.core.events import EngineOutput, FinishReason, TextOutput, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.base import (
    AcceptingOutputs,
    ClosableOutputs,
    Engine,
    ListenableOutputs,
    OutputKind,
    TextEngine,
)
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.server.prepare.tokens import Plan
from sluicegate.server.streaming.buffer import Outbox

__all__ = ["COUNT_WAIT_S", "INTERNAL_ERROR_MESSAGE", "RESPONDED_GRACE_S", "Generation"]

COUNT_WAIT_S = 1.0
"""Longest wait (seconds) for an upstream's count of the prompt before the
headers; past it the first event goes without it."""

RESPONDED_GRACE_S = 0.5
"""After an upstream's 200, how long its first content is waited for before
the client's headers go out anyway (seconds): a 200 that breaks at once still
reaches the client as a status (and is failed over), a long prefill does not
hold the headers."""

logger = logging.getLogger(__name__)

INTERNAL_ERROR_MESSAGE = "The server failed while streaming this response"
"""The in-band error of a bug: the details stay in the server's log."""

_Outputs = AsyncIterator[EngineOutput] | AsyncIterator[TextOutput]


class Generation:
    """The ``n`` engine sequences of one response and their decoder.

    Args:
        engine: the engine to run on.
        plan: the checked request (prompt ids, params, stop strings, ``n``).
        clock: what ``accepted()``'s waits run on (the patience, the count of
            the prompts); ``None``: the running loop.
    """

    def __init__(self, engine: Engine, plan: Plan, clock: Timers | None = None) -> None:
        self._engine = engine
        self._plan = plan
        self._clock = clock
        self._capabilities = engine.capabilities
        self._logprobs = self._capabilities.logprobs
        # The decoding stage: token ids are detokenized with the engine's
        # tokenizer, text arrives decoded; prompt_of: each sequence's prompt.
        tokenizer = None
        if engine.output_kind is OutputKind.TOKENS:
            tokenizer = engine.tokenizer
        self._decoder = new_response_decoder(
            plan.tools,
            [
                ChoiceOptions(c.echo, c.params.stop_token_ids, c.params.ignore_eos)
                for c in plan.choices
            ],
            tokenizer,
            prompt_tokens=plan.prompt_tokens,
            prompt_of=[c.prompt_index for c in plan.choices],
            stops=plan.stops,
            include_stop_str_in_output=plan.include_stop_str_in_output,
            skip_special_tokens=plan.skip_special_tokens,
            logprobs=plan.logprobs is not None and self._logprobs,
            calls=plan.calls,
            continuous_usage=plan.continuous_usage,
            reasoning=plan.reasoning,
            reasoning_budget=plan.reasoning_budget,
        )
        self._aborts = self._decoder.aborts  # read once per token
        self._header = plan.header
        self._sequence_ids = plan.sequence_ids
        self._outputs: list[_Outputs | None] = [None] * len(self._sequence_ids)
        self._outbox = Outbox()  # where attach() puts events
        self._attached = False
        self._unended: Sequence[int] = ()  # flushed, not aborted yet
        self._readers: list[asyncio.Task[None]] = []  # for plain async iterators
        self._listened: list[ListenableOutputs] = []

    @property
    def usage(self) -> Usage:
        """Prompt tokens once, completion tokens received summed over choices."""
        return self._decoder.usage

    @property
    def usage_estimated(self) -> bool:
        """Whether ``usage`` is an estimate (``ResponseDecoder.usage_estimated``)."""
        return self._decoder.usage_estimated

    @property
    def stop_sequences(self) -> tuple[str | None, ...]:
        """Each choice's matched stop string (``None`` for none)."""
        return self._decoder.stop_sequences

    @property
    def finish_reasons(self) -> tuple[FinishReason | None, ...]:
        """Each choice's finish reason, by index (``None`` while open)."""
        return self._decoder.finish_reasons

    @property
    def first_token_at(self) -> float | None:
        """Unix time (seconds) the first token arrived, or ``None``."""
        return self._decoder.first_token_at

    @property
    def wants_logprobs(self) -> bool:
        """Whether the request asked for logprobs (each ``Delta`` then has them)."""
        return self._plan.logprobs is not None

    def start(self) -> None:
        """Submit every choice to the engine, before any byte is sent.

        Raises:
            RequestError: logprobs asked of an engine without them
                (``Capabilities.logprobs``: one that yields text).
            EngineError: an engine that refuses at once (``EngineUnavailable`` for
                a full queue); the choices already submitted are aborted.
        """
        if not self._logprobs and self._plan.logprobs is not None:
            raise RequestError(
                "logprobs are not available from this model's engine",
                param="logprobs",
            )
        try:
            for index, request in enumerate(self._plan.requests()):
                self._outputs[index] = self._engine.generate(request)
        finally:
            if any(outputs is None for outputs in self._outputs):
                self.abort_unfinished()

    @property
    def awaits_acceptance(self) -> bool:
        """Whether the engine may still refuse a started choice (``accepted()``)."""
        late = self._capabilities.late_acceptance
        return late and any(o is not None for o in self._outputs)

    async def accepted(self, patience_s: float | None = None) -> None:
        """Wait until the engine has accepted every choice, before any byte.

        Returns at once for an engine that accepts at ``generate()``; waits on
        ``AcceptingOutputs.accepted()`` (an upstream's first content) for the
        others, all choices at once. With ``patience_s``, returns too once each
        has ``responded()`` (an upstream's 200) and ``patience_s`` more seconds
        passed (a long prefill): the client then gets its headers and
        heartbeats, and a refusal after that reaches it in band. The prompt's
        tokens the engine said (``usage``) or counted go in ``header``.

        Raises:
            EngineError: a choice was refused (``EngineRefused`` with its own
                status, ``EngineUnavailable``) while this waited; every choice
                is aborted then.
        """
        if not self._capabilities.late_acceptance:
            return
        accepting = [
            (index, cast(AcceptingOutputs, outputs))  # declared so
            for index, outputs in enumerate(self._outputs)
            if outputs is not None
        ]
        if not accepting:
            return
        tasks = [asyncio.ensure_future(a.accepted()) for _, a in accepting]
        prompts = [self._plan.choices[index].prompt_index for index, _ in accepting]
        every: asyncio.Future[Any] = asyncio.gather(*tasks)  # every exception
        patient: asyncio.Future[Any] | None = None
        clock = self._clock or asyncio.get_running_loop()
        if patience_s is not None:
            waiting = _responded_then(clock, patience_s, [a for _, a in accepting])
            patient = asyncio.ensure_future(waiting)
        try:
            waits = {every} if patient is None else {every, patient}
            await asyncio.wait(waits, return_when="FIRST_COMPLETED")
            if every.done():
                counts = every.result()
            else:  # responded, then out of patience: go on with what it said
                every.add_done_callback(_retrieved)
                counts = [a.usage for _, a in accepting]
        except BaseException:
            for task in tasks:
                task.cancel()
            every.add_done_callback(_retrieved)
            self.abort_unfinished()
            raise
        finally:
            if patient is not None:
                patient.cancel()
        known = {p: u for p, u in zip(prompts, counts, strict=True) if u is not None}
        missing = {c.prompt_index for c in self._plan.choices} - known.keys()
        if missing and self._counts_early():
            counted: dict[int, Usage] = {}
            # A nicety, not worth a late first byte: a slow counter is skipped.
            with contextlib.suppress(TimeoutError):
                async with Deadline(clock, COUNT_WAIT_S):
                    await self._count_prompts(missing, counted)
            known |= counted
        if len(known) == len({c.prompt_index for c in self._plan.choices}):
            self._header = dataclasses.replace(
                self._plan.header,
                prompt_tokens=sum(u.prompt_tokens for u in known.values()),
                cached_tokens=sum(u.cached_tokens for u in known.values()),
            )

    def _counts_early(self) -> bool:
        """Whether the prompt's tokens are wanted in the first event, of an
        engine that can count them when it did not say them at acceptance."""
        return self._usage_first() and self._capabilities.counts_prompts

    def _usage_first(self) -> bool:  # message_start, or continuous usage
        messages = self._plan.header.endpoint is Endpoint.MESSAGES and self._plan.stream
        return messages or self._plan.continuous_usage

    @property
    def awaits_cached(self) -> bool:
        """Whether ``cached_known()`` waits (it returns at once otherwise)."""
        return self._capabilities.prefix_cache and self._usage_first()

    async def cached_known(self, patience_s: float) -> None:
        """For an engine that reuses prompt prefixes and a first event that
        says the usage: at most ``patience_s`` (on the clock) for each choice's
        first output, its ``cached_tokens`` then in ``header`` (per prompt)."""
        if not self.awaits_cached:
            return
        outputs = [cast(SequenceOutputs[EngineOutput], o) for o in self._outputs]
        with contextlib.suppress(TimeoutError):
            async with Deadline(self._clock or asyncio.get_running_loop(), patience_s):
                firsts = await asyncio.gather(*(o.first() for o in outputs))
                pairs = zip(self._plan.choices, firsts, strict=True)
                cached = {c.prompt_index: f.cached_tokens for c, f in pairs if f}
                total = sum(cached.values())
                self._header = dataclasses.replace(self._header, cached_tokens=total)

    async def _count_prompts(
        self, prompts: set[int], counted: dict[int, Usage]
    ) -> None:
        """The engine's count of each of ``prompts`` (an upstream's tokenizer)
        into ``counted``, reported to the decoder until the engine's own usage
        replaces it."""
        engine = cast(TextEngine, self._engine)  # counts_prompts: declared so
        requests = self._plan.requests()
        for prompt in sorted(prompts):
            index = next(
                i for i, c in enumerate(self._plan.choices) if c.prompt_index == prompt
            )
            tokens = await engine.count_prompt(requests[index], {}, estimate=True)
            if tokens is not None:
                counted[prompt] = Usage(tokens, 0)
                self._decoder.report_prompt(prompt, tokens)

    @property
    def header(self) -> ResponseHeader:
        """The plan's header, with the prompt and cached tokens the engine said
        before the headers (``accepted()``, ``cached_known()``) for the first event."""
        return self._header

    def attach(self, outbox: Outbox) -> None:
        """Read every choice into ``outbox`` from now on, without blocking.

        Each choice's events go to ``outbox`` as the engine produces them; when
        the last choice has finished, one ``End`` follows. An engine failure is a
        ``Fail``; so is a bug met while decoding a step (logged with its
        traceback, then ``internal_error``). Call ``detach()`` when the response
        ends, then ``abort_unfinished()``.
        """
        assert not self._attached, "attach() once"
        self._attached = True
        self._outbox = outbox
        for index, outputs in enumerate(self._outputs):
            assert outputs is not None, "start() before attach()"
            for event in self._decoder.start(index):
                outbox.put(event)
            if self._capabilities.listenable:
                listenable = cast(ListenableOutputs, outputs)  # declared so
                self._listened.append(listenable)
                listenable.listen(functools.partial(self._on_item, index))
            else:
                reader = asyncio.get_running_loop().create_task(
                    self._read(index, outputs)
                )
                self._readers.append(reader)

    def detach(self) -> None:
        """Stop reading: nothing more goes to the outbox. Safe to call repeatedly."""
        for reader in self._readers:
            reader.cancel()  # each closes its iterator as it ends
        self._flush()
        for outputs in self._listened:
            outputs.close()
        # Let go of the outbox, as before attach(): its writer may hold this
        # generation, a cycle only the garbage collector would free.
        self._outbox = Outbox()

    def abort_unfinished(self) -> None:
        """Abort every sequence the engine has not ended; safe to call repeatedly."""
        self._flush()
        unended, self._unended = self._unended, ()
        for index in unended:
            self._engine.abort(self._sequence_ids[index])

    def _flush(self) -> None:
        if unended := self._decoder.flush():
            self._unended = unended

    async def _read(self, index: int, outputs: _Outputs) -> None:
        """Feed an engine's plain async iterator to ``_on_item`` (no listener)."""
        try:
            async for output in outputs:
                self._on_item(index, output)
                if self._decoder.closed(index):
                    return
            self._on_item(index, None)
        except EngineError as exc:
            self._on_item(index, exc)
        except Exception:  # the reader task's outermost frame: a bug
            self._fail_internal(index)
        finally:
            # Not listenable: closed as the protocol says (an async generator's).
            await asyncio.shield(cast(ClosableOutputs, outputs).aclose())

    def _on_item(self, index: int, item: OutputItem) -> None:
        """One item of a choice's engine sequence, decoded into the outbox.

        The outermost frame of the engine's callback: a bug here must not reach
        the engine's loop, so it becomes this response's ``internal_error``.
        """
        try:
            events = self._decoder.feed(index, item)
            if self._aborts:  # a stop string ended a choice: stop its sequence
                self._abort_stopped()
            put = self._outbox.put
            for event in events:
                put(event)
        except Exception:  # see the docstring: log it, fail this response
            self._fail_internal(index)

    def _abort_stopped(self) -> None:
        aborts = self._aborts
        while aborts:
            self._engine.abort(self._sequence_ids[aborts.pop(0)], stopped=True)

    def _fail_internal(self, index: int) -> None:
        logger.exception("reading sequence %s failed", self._sequence_ids[index])
        failed = self._decoder.fail(index, INTERNAL_ERROR_MESSAGE, "internal_error")
        for event in failed:
            self._outbox.put(event)


async def _responded_then(
    clock: Timers, patience_s: float, accepting: Sequence[AcceptingOutputs]
) -> None:
    """Every choice has responded, then ``patience_s`` seconds passed on ``clock``."""
    await asyncio.gather(*(a.responded() for a in accepting))
    await Deadline(clock, patience_s).passed()


def _retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback: the exception retrieved (the outputs report it, in band)."""
    if not future.cancelled():
        future.exception()
