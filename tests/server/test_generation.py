"""Generation, the shell around the decoder: listened and iterated outputs, stop
aborts, abort_unfinished, and engines that yield text."""

from __future__ import annotations

from collections.abc import AsyncIterator

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
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.engines.base import (
    Capabilities,
    Engine,
    GenerateRequest,
    SamplingParams,
)
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.server.prepare.tokens import ChoicePlan, Plan
from sluicegate.server.streaming.buffer import Outbox
from sluicegate.server.streaming.generation import Generation

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
