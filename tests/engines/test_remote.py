"""RemoteEngine against a real engine host on a Unix socket, in this test's
loop: the scripted engine served across the IPC, its acceptance, refusals,
aborts, its loss and its return; grammar checks compiled on the engine's
side; the host's beats of a stalled engine, judged stuck."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sluicegate.core.errors import EngineCrashed, EngineUnavailable
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.core.restarts import Beat, StuckWatch
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.remote.engine import RemoteEngine
from sluicegate.engines.remote.host import beat_path, read_beat, serve_engine
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
async def test_the_stats_come_with_each_steps_outputs_and_to_an_idle_worker(
    served: Served, tmp_path: Path
) -> None:
    # A second worker, connected (its first request ended), then idle.
    idle = await asyncio.to_thread(RemoteEngine.connect, tmp_path / "engine.sock")
    with anyio.fail_after(10):
        first = idle.generate(_request("r-idle", max_tokens=1))
        await first.accepted()
        assert [len(o.token_ids) async for o in first] == [1]
    # A worker with a request running gets the engine's stats in the frame of
    # each step's outputs (not on a timer of their own): when an output is
    # read, the stats already count it.
    outputs = served.remote.generate(_request("r-s", max_tokens=20))
    counted: list[tuple[int, int]] = []
    with anyio.fail_after(10):
        await outputs.accepted()
        received = 0
        async for output in outputs:
            received += len(output.token_ids)
            counted.append((received, served.remote.stats().generated_tokens))
    assert received == 20
    assert all(stats >= 1 + tokens for tokens, stats in counted), counted
    # The idle worker got no output since: the host's tick sends them.
    with anyio.fail_after(10):
        while idle.stats().generated_tokens < 21:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    await idle.aclose()


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


@pytest.mark.anyio
async def test_the_engine_is_unavailable_while_its_process_is_away_then_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "engine.sock"

    def serve(stop: asyncio.Event) -> asyncio.Future[int]:
        engine = ScriptedEngine("a b c", tokens_per_s=200.0)
        return asyncio.ensure_future(
            serve_engine(engine, path, engine.tokenizer, stop=stop)
        )

    first_stop, second_stop = asyncio.Event(), asyncio.Event()
    first = serve(first_stop)
    remote = await asyncio.to_thread(RemoteEngine.connect, path, 10.0)
    try:
        with anyio.fail_after(10):
            await remote.generate(_request("u-0")).accepted()
        assert remote.stats().unavailable is None
        first_stop.set()  # the engine process goes away
        with anyio.fail_after(10):
            await first
            while remote.stats().unavailable is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            with pytest.raises(EngineUnavailable):
                await remote.generate(_request("u-1")).accepted()
            caplog.set_level(logging.DEBUG, logger="sluicegate.engines.remote")
            while len(_unreachable(caplog)) < 3:  # noqa: ASYNC110 (every 0.1 s)
                await asyncio.sleep(0.01)
        # Said once per absence, not ten times a second while a model loads.
        levels = [record.levelno for record in _unreachable(caplog)]
        assert levels[0] == logging.WARNING
        assert set(levels[1:]) == {logging.DEBUG}
        second = serve(second_stop)  # restarted on the same socket
        with anyio.fail_after(10):
            while remote.stats().unavailable is not None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await remote.generate(_request("u-2")).accepted()
    finally:
        await remote.aclose()
        first_stop.set()
        second_stop.set()
    with anyio.fail_after(10):
        await second


def _unreachable(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The records of failed tries to reach the engine process."""
    return [r for r in caplog.records if "unreachable" in r.getMessage()]


async def _next_beat(path: Path, after: Beat | None) -> Beat:
    """The first beat in ``path`` written after ``after`` (a later tick)."""
    with anyio.fail_after(10):
        while True:
            beat = read_beat(path)
            if beat is not None and (after is None or beat.tick > after.tick + 1):
                return beat
            await asyncio.sleep(0.01)


@pytest.mark.anyio
async def test_a_stalled_engine_beats_busy_without_progress_and_is_judged_stuck(
    tmp_path: Path,
) -> None:
    """The scripted engine's stall fault, on a clock the test moves: the engine
    process still beats, but its step never comes; the supervisor's watch says
    stuck at the step deadline, not before."""
    clock = ManualClock()
    engine = ScriptedEngine(
        "a b c d e f", tokens_per_s=10.0, stall_at_step=2, stall_s=3600.0, clock=clock
    )
    path = tmp_path / "engine.sock"
    stop = asyncio.Event()
    host = asyncio.ensure_future(
        serve_engine(engine, path, engine.tokenizer, stop=stop)
    )
    remote = await asyncio.to_thread(RemoteEngine.connect, path, 10.0)
    watch = StuckWatch(heartbeat_s=3600.0, step_deadline_s=30.0)
    try:
        outputs = remote.generate(_request("s-0", max_tokens=100))
        with anyio.fail_after(10):
            await outputs.accepted()
        clock.advance(0.25)  # steps 0 and 1; step 2 waits an hour
        assert engine.stats().generated_tokens == 2
        # The beat there now may have been written before the steps: take one
        # written after it.
        seen = await _next_beat(beat_path(path), None)
        beat = await _next_beat(beat_path(path), seen)
        assert beat.busy
        verdicts = [watch.feed(clock.time(), beat)]
        for _ in range(3):
            clock.advance(10.0)
            beat = await _next_beat(beat_path(path), beat)
            verdicts.append(watch.feed(clock.time(), beat))
    finally:
        await remote.aclose()
        stop.set()
        with anyio.fail_after(10):
            await host
    assert verdicts[:3] == [None, None, None]
    assert verdicts[3] is not None
    assert verdicts[3].startswith("busy without progress for 30.0 s")


class _SlowToClose(ScriptedEngine):
    """A scripted engine whose ``aclose`` waits for the test (a step in
    flight that closing waits for)."""

    def __init__(self) -> None:
        super().__init__("a b c")
        self.closing = asyncio.Event()
        self.closed = asyncio.Event()

    async def aclose(self) -> None:
        self.closing.set()
        await self.closed.wait()
        await super().aclose()


@pytest.mark.anyio
async def test_the_engine_process_beats_until_its_engine_is_closed(
    tmp_path: Path,
) -> None:
    """Told to stop, the host goes on beating while the engine closes, so the
    supervisor does not take a slow close for a stuck process."""
    engine = _SlowToClose()
    path = tmp_path / "engine.sock"
    stop = asyncio.Event()
    host = asyncio.ensure_future(
        serve_engine(engine, path, engine.tokenizer, stop=stop)
    )
    try:
        await _next_beat(beat_path(path), None)
        stop.set()
        with anyio.fail_after(10):
            await engine.closing.wait()
        closing = read_beat(beat_path(path))
        assert closing is not None
        later = await _next_beat(beat_path(path), closing)
        assert later.tick > closing.tick
    finally:
        engine.closed.set()
        with anyio.fail_after(10):
            await host
