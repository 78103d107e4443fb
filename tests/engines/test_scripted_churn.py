"""200 random generate and abort operations leave the scripted engine empty.

Property test (hypothesis, the ``ci`` profile): whatever the order of starts,
aborts, early exits and waits, once everything has ended no KV cell is in use and
nothing is queued or running, and every request ended exactly once: with a
finish_reason, by an abort, or refused at once by a full queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.errors import EngineUnavailable
from sluicegate.core.events import EngineOutput
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(1, 12)),
        st.tuples(st.just("abort"), st.integers(0, 199)),
        st.tuples(st.just("leave"), st.integers(0, 199)),
        st.tuples(st.just("wait"), st.integers(0, 3)),
    ),
    min_size=200,
    max_size=200,
)


async def _drain(outputs: AsyncIterator[EngineOutput], leave_after: int | None) -> str:
    seen = 0
    async for out in outputs:
        seen += 1
        if out.finish_reason is not None:
            return "finished"
        if leave_after is not None and seen >= leave_after:
            await outputs.aclose()  # type: ignore[attr-defined]
            return "left"
    return "aborted"


async def _churn(ops: list[tuple[str, int]]) -> None:
    engine = ScriptedEngine(tokens_per_s=5000, max_running=4, max_queued=8)
    tasks: list[asyncio.Task[str]] = []
    ids: list[str] = []
    leave: dict[int, int] = {}
    refused = 0
    for op, arg in ops:
        if op == "start":
            rid = f"r{len(ids)}"
            request = GenerateRequest(rid, (2, 10, 11), SamplingParams(max_tokens=arg))
            try:
                outputs = engine.generate(request)
            except EngineUnavailable:
                refused += 1
                continue
            ids.append(rid)
            tasks.append(
                asyncio.ensure_future(_drain(outputs, leave.get(len(ids) - 1)))
            )
        elif op == "abort" and ids:
            engine.abort(ids[arg % len(ids)])
        elif op == "leave":
            leave[arg] = 1 + arg % 3
        else:
            await asyncio.sleep(arg / 1000)
    ends = await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    assert set(ends) <= {"finished", "aborted", "left"}
    assert len(ends) + refused == sum(op == "start" for op, _ in ops)
    stats = engine.stats()
    assert (stats.kv_cells_used, stats.queued, stats.running) == (0, 0, 0)
    await engine.aclose()


@settings(max_examples=10)
@given(OPS)
def test_random_starts_and_aborts_leave_no_cells_queue_or_running(
    ops: list[tuple[str, int]],
) -> None:
    asyncio.run(_churn(ops))
