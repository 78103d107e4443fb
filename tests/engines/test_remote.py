"""RemoteEngine against a real engine host on a Unix socket, in this test's
loop: the scripted engine served across the IPC, its acceptance, refusals,
aborts and its loss; grammar checks compiled on the engine's side."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sluicegate.core.errors import EngineCrashed, EngineUnavailable
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.remote.engine import RemoteEngine
from sluicegate.engines.remote.host import serve_engine
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.values import GenerateRequest, SamplingParams


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Served:
    def __init__(self, engine: ScriptedEngine, remote: RemoteEngine) -> None:
        self.engine = engine
        self.remote = remote


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    engine = ScriptedEngine("one two three four five six", tokens_per_s=200.0)
    path = tmp_path / "engine.sock"
    stop = asyncio.Event()
    host = asyncio.ensure_future(
        serve_engine(engine, path, engine.tokenizer, stop=stop)
    )
    remote = await asyncio.to_thread(RemoteEngine.connect, path, 10.0)
    yield Served(engine, remote)
    await remote.aclose()
    stop.set()
    with anyio.fail_after(10):
        await host


def _request(request_id: str, max_tokens: int = 4) -> GenerateRequest:
    return GenerateRequest(request_id, (1, 2, 3), SamplingParams(max_tokens=max_tokens))


@pytest.mark.anyio
async def test_a_request_is_accepted_then_its_token_ids_arrive(served: Served) -> None:
    outputs = served.remote.generate(_request("r-0"))
    with anyio.fail_after(10):
        await outputs.accepted()
        got: list[EngineOutput] = [o async for o in outputs]
    assert sum(len(o.token_ids) for o in got) == 4
    assert got[-1].finish_reason is FinishReason.LENGTH


@pytest.mark.anyio
async def test_an_abort_crosses_and_the_sequence_ends_without_a_finish(
    served: Served,
) -> None:
    outputs = served.remote.generate(_request("r-1", max_tokens=10_000))
    with anyio.fail_after(10):
        await outputs.accepted()
        first = await outputs.__anext__()
        served.remote.abort("r-1")
        rest = [o async for o in outputs]
    assert first.token_ids
    assert all(o.finish_reason is None for o in rest)
    with anyio.fail_after(10):
        while "r-1" not in served.engine.stats().aborted_ids:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_a_closed_engine_link_fails_running_requests_as_crashed(
    served: Served,
) -> None:
    outputs = served.remote.generate(_request("r-2", max_tokens=10_000))
    with anyio.fail_after(10):
        await outputs.accepted()
        await outputs.__anext__()
    link = served.remote._link
    assert link is not None
    assert link.transport is not None
    link.transport.abort()  # what the engine process's death looks like here
    with anyio.fail_after(10), pytest.raises(EngineCrashed):
        async for _ in outputs:
            pass


@pytest.mark.anyio
async def test_a_full_queue_is_refused_at_acceptance(tmp_path: Path) -> None:
    engine = ScriptedEngine("a b c", max_running=1, max_queued=0, tokens_per_s=1.0)
    path = tmp_path / "engine.sock"
    stop = asyncio.Event()
    host = asyncio.ensure_future(
        serve_engine(engine, path, engine.tokenizer, stop=stop)
    )
    remote = await asyncio.to_thread(RemoteEngine.connect, path, 10.0)
    try:
        running = remote.generate(_request("q-0", max_tokens=100))
        refused = remote.generate(_request("q-1"))
        with anyio.fail_after(10):
            await running.accepted()
            with pytest.raises(EngineUnavailable):
                await refused.accepted()
    finally:
        await remote.aclose()
        stop.set()
        with anyio.fail_after(10):
            await host


@pytest.mark.anyio
async def test_grammars_are_checked_by_the_engine_process(served: Served) -> None:
    good = '%llguidance {}\nstart: "yes" | "no"\n'
    bad = "%llguidance {}\nstart: undefined_rule\n"
    assert await asyncio.to_thread(served.remote.grammar_errors, good) == []
    assert await asyncio.to_thread(served.remote.grammar_errors, bad)
