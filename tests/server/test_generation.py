"""Generation, the shell around the decoder: listened and iterated outputs, stop
aborts, abort_unfinished, and engines that yield text."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from sluicegate.core.errors import RequestError
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    Usage,
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.base import (
    Capabilities,
    Engine,
    GenerateRequest,
    SamplingParams,
)
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.server.prepare.tokens import ChoicePlan, Plan
from sluicegate.server.streaming.buffer import Outbox
from sluicegate.server.streaming.generation import COUNT_WAIT_S, Generation

pytestmark = pytest.mark.anyio

PROMPT = (0, 100, 101)


def _plan(
    n: int = 1,
    stops: tuple[str, ...] = (),
    logprobs: int | None = None,
    max_tokens: int = 100,
) -> Plan:
    header = ResponseHeader("cmpl-t", 1, "scripted", Endpoint.COMPLETION, n)
    params = SamplingParams(max_tokens=max_tokens, logprobs=logprobs)
    return Plan(
        header,
        (PROMPT,),
        tuple(ChoicePlan(0, params) for _ in range(n)),
        stops=stops,
        logprobs=logprobs,
    )


class _Iterated(ScriptedEngine):
    """Outputs as a plain async iterator: read by a task, not listened to."""

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(logprobs=True)  # plain iterators: not listenable

    def generate(self, request: GenerateRequest) -> AsyncIterator[EngineOutput]:
        outputs = super().generate(request)

        async def plain() -> AsyncIterator[EngineOutput]:
            try:
                async for output in outputs:
                    yield output
            finally:
                await outputs.aclose()  # type: ignore[attr-defined]

        return plain()


async def _run(engine: Engine, plan: Plan) -> list[StreamEvent]:
    """Every event of one generation, to its ``End`` or ``Fail``."""
    generation = Generation(engine, plan)
    generation.start()
    outbox = Outbox()
    events: list[StreamEvent] = []
    generation.attach(outbox)
    try:
        with anyio.fail_after(5):
            while not events or not isinstance(events[-1], End | Fail):
                await outbox.wait()
                events += outbox.drain()
    finally:
        generation.detach()
        generation.abort_unfinished()
    return events


def _texts(events: list[StreamEvent], index: int = 0) -> str:
    return "".join(e.text for e in events if isinstance(e, Delta) and e.index == index)


@pytest.mark.parametrize("stops", [(), ("fox",)])
async def test_listened_and_iterated_outputs_give_the_same_events(
    stops: tuple[str, ...],
) -> None:
    listened = await _run(ScriptedEngine(tokens_per_s=10_000), _plan(2, stops))
    iterated = await _run(_Iterated(tokens_per_s=10_000), _plan(2, stops))
    assert [e for e in listened if e.__class__ is not Delta] == [
        e for e in iterated if e.__class__ is not Delta
    ]
    for index in (0, 1):
        assert _texts(listened, index) == _texts(iterated, index)
    expected = DEFAULT_TEXT.split("fox")[0] if stops else DEFAULT_TEXT
    assert _texts(listened) == expected


async def test_a_stop_string_stops_its_engine_sequence_as_finished() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=10_000)
    events = await _run(engine, _plan(stops=("quick",)))
    assert events[-2:-1] == [Finish(0, FinishReason.STOP, stop_sequence="quick")]
    assert isinstance(events[-1], End)
    assert _texts(events) == DEFAULT_TEXT.split("quick")[0]
    stats = engine.stats()
    assert (stats.running, stats.finished_requests, stats.aborted_requests) == (
        0,
        1,
        0,
    )
    assert stats.aborted_ids == ()


async def test_abort_unfinished_aborts_what_runs_once() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=1000)
    generation = Generation(engine, _plan(2))
    generation.start()
    generation.attach(Outbox())
    generation.detach()
    generation.abort_unfinished()
    generation.abort_unfinished()
    stats = engine.stats()
    assert (stats.running, stats.aborted_requests) == (0, 2)
    assert generation.finish_reasons == (None, None)


async def test_a_text_engine_streams_the_same_text_and_usage_as_tokens() -> None:
    tokens = await _run(ScriptedEngine(tokens_per_s=10_000), _plan(stops=("brown",)))
    texts = await _run(ScriptedTextEngine(tokens_per_s=10_000), _plan(stops=("brown",)))
    assert _texts(texts) == _texts(tokens) == DEFAULT_TEXT.split("brown")[0]
    assert texts[-2:] == tokens[-2:]  # Finish(stop), End(usage)


async def test_a_text_engine_at_max_tokens_flushes_and_counts_its_steps() -> None:
    events = await _run(ScriptedTextEngine(tokens_per_s=10_000), _plan(max_tokens=3))
    assert events[-2] == Finish(0, FinishReason.LENGTH)
    end = events[-1]
    assert isinstance(end, End)
    assert end.usage.completion_tokens == 3


async def test_logprobs_from_a_text_engine_are_refused_before_any_byte() -> None:
    engine = ScriptedTextEngine()
    generation = Generation(engine, _plan(logprobs=0))
    with pytest.raises(RequestError, match="logprobs") as caught:
        generation.start()
    assert caught.value.param == "logprobs"
    assert engine.stats().running == 0


class _LongPrefill(ScriptedTextEngine):
    """An upstream behind a long prefill: it answers (``responded()``) at once
    but accepts only once ``accept`` is set, and its prompt counter never
    answers."""

    def __init__(self) -> None:
        super().__init__(tokens_per_s=10_000)
        self.accept = asyncio.Event()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(listenable=True, late_acceptance=True, counts_prompts=True)

    def generate(self, request: GenerateRequest) -> Any:
        return _Answered(super().generate(request), self.accept)

    async def count_prompt(self, *args: Any, **kwargs: Any) -> int | None:
        await asyncio.Event().wait()  # never set: given up on by the server
        return None


class _Answered:
    usage: Usage | None = None  # said nothing before its first content

    def __init__(self, outputs: SequenceOutputs[Any], accept: asyncio.Event) -> None:
        self._outputs = outputs
        self._accept = accept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._outputs, name)

    async def accepted(self) -> Usage | None:
        await self._accept.wait()
        return None

    async def responded(self) -> None:
        return None


async def _accepting(
    clock: ManualClock, generation: Generation, patience_s: float | None
) -> asyncio.Task[None]:
    generation.start()
    waiting = asyncio.ensure_future(generation.accepted(patience_s))
    await _settle()
    return waiting


async def _settle() -> None:
    """Let the loop run what is ready (no timer: the clock is stepped)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def _advance(clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    await _settle()


async def test_a_response_without_acceptance_waits_its_patience_on_the_clock() -> None:
    clock = ManualClock()
    generation = Generation(_LongPrefill(), _plan(), clock)
    waiting = await _accepting(clock, generation, patience_s=0.5)
    await _advance(clock, 0.4)
    assert not waiting.done()
    await _advance(clock, 0.1)
    assert waiting.done()
    assert waiting.result() is None  # out of patience: the headers go out
    generation.abort_unfinished()


async def test_a_prompt_count_that_never_comes_is_given_up_on_the_clock() -> None:
    engine = _LongPrefill()
    engine.accept.set()
    header = ResponseHeader("msg-t", 1, "scripted", Endpoint.MESSAGES, 1)
    choice = ChoicePlan(0, SamplingParams(max_tokens=5))
    plan = Plan(header, (PROMPT,), (choice,), stream=True)
    clock = ManualClock()
    generation = Generation(engine, plan, clock)
    waiting = await _accepting(clock, generation, patience_s=None)
    await _advance(clock, COUNT_WAIT_S * 0.9)
    assert not waiting.done()
    await _advance(clock, COUNT_WAIT_S * 0.1)
    assert waiting.done()
    waiting.result()
    assert generation.header == plan.header  # the first event goes without it
    generation.abort_unfinished()
