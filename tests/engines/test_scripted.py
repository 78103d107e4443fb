"""ScriptedEngine and ScriptedTokenizer: scripts, limits, faults, timing.

Timing tests run on a ``ManualClock``: they step time instead of sleeping, so
what they see does not depend on how busy the machine is.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from tests.polling import wait_until

from sluicegate.core.errors import EngineError, EngineUnavailable
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.base import Engine, GenerateRequest, OutputItem, SamplingParams
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.outputs import SequenceOutputs
from sluicegate.engines.scripted.engine import (
    DEFAULT_TEXT,
    ScriptedEngine,
    parse_faults,
)
from sluicegate.engines.scripted.vocab import BYTES_START, ScriptedTokenizer

TOKENIZER = ScriptedTokenizer()
PROMPT = (0, 100, 101, 102)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _request(
    request_id: str = "r", max_tokens: int = 100, **params: Any
) -> GenerateRequest:
    return GenerateRequest(
        request_id, PROMPT, SamplingParams(max_tokens=max_tokens, **params)
    )


def _ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special=False, parse_special=True)


async def _collect(outputs: AsyncIterator[Any]) -> list[EngineOutput]:
    return [output async for output in outputs]


def _timed(
    engine: ScriptedEngine, clock: ManualClock, request: GenerateRequest
) -> list[tuple[float, OutputItem]]:
    """Listen to ``request``'s outputs: each item with the clock's time."""
    outputs = engine.generate(request)
    assert isinstance(outputs, SequenceOutputs)
    seen: list[tuple[float, OutputItem]] = []
    outputs.listen(lambda item: seen.append((clock.time(), item)))
    return seen


# --- tokenizer ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello world",
        DEFAULT_TEXT,
        "🦩🪼 🦩🪼 🦩",
        "a\x00b\r\nc",
        "<bos> not special",
    ],
)
def test_encode_then_decode_gives_the_text_back(text: str) -> None:
    ids = TOKENIZER.encode(text, add_special=False, parse_special=False)
    assert TOKENIZER.decode(ids) == text


def test_special_text_is_parsed_only_when_asked() -> None:
    text = "<start_of_turn>user\nHi<end_of_turn>"
    parsed = TOKENIZER.encode(text, add_special=False, parse_special=True)
    plain = TOKENIZER.encode(text, add_special=False, parse_special=False)
    assert parsed[0] == 2
    assert parsed[-1] == TOKENIZER.end_of_turn_id
    assert not set(plain) & TOKENIZER.special_ids
    assert TOKENIZER.decode(parsed) == "user\nHi"


def test_encode_takes_the_longest_piece_and_finds_specials_after_any_text() -> None:
    ids = TOKENIZER.encode("Hello<<eos> The", add_special=False, parse_special=True)
    pieces = [TOKENIZER.pieces[i] for i in ids]
    assert pieces == [b"Hello", b"<", b"<eos>", b" The"]
    assert ids[2] == TOKENIZER.eos_id


def test_add_special_prepends_bos() -> None:
    assert TOKENIZER.encode("Hi", add_special=True, parse_special=False) == [
        TOKENIZER.bos_id,
        *TOKENIZER.encode("Hi", add_special=False, parse_special=False),
    ]


def test_vocabulary_has_unique_pieces_and_splits_characters() -> None:
    pieces = TOKENIZER.pieces
    assert len(set(pieces)) == len(pieces)
    assert all(pieces[BYTES_START + b] == bytes([b]) for b in range(256))
    multi = pieces[BYTES_START + 256 :]
    undecodable = [p for p in multi if "\ufffd" in p.decode("utf-8", "replace")]
    assert len(undecodable) >= 4
    assert TOKENIZER.stop_ids == {TOKENIZER.eos_id, TOKENIZER.end_of_turn_id}
    assert TOKENIZER.stop_ids <= TOKENIZER.special_ids


# --- scripts and limits ------------------------------------------------------


@pytest.mark.anyio
async def test_default_script_says_the_canned_text_then_stops() -> None:
    engine: Engine = ScriptedEngine(tokens_per_s=10_000)
    outputs = await _collect(engine.generate(_request()))
    ids = [i for output in outputs for i in output.token_ids]
    assert TOKENIZER.decode(ids) == DEFAULT_TEXT
    assert outputs[-1] == EngineOutput((), FinishReason.STOP)
    assert all(o.finish_reason is None for o in outputs[:-1])
    assert not set(ids) & TOKENIZER.stop_ids
    stats = engine.stats()
    assert stats.generated_tokens == len(ids)
    assert stats.finished_requests == 1
    assert stats.kv_cells_used == 0
    assert stats.running == 0


@pytest.mark.anyio
async def test_max_tokens_finishes_with_length_on_the_last_token() -> None:
    engine = ScriptedEngine(tokens_per_s=10_000)
    outputs = await _collect(engine.generate(_request(max_tokens=3)))
    assert [len(o.token_ids) for o in outputs] == [1, 1, 1]
    assert [o.finish_reason for o in outputs] == [None, None, FinishReason.LENGTH]
    assert engine.stats().generated_tokens == 3


@pytest.mark.anyio
async def test_stop_token_ids_end_the_sequence_without_the_token() -> None:
    engine = ScriptedEngine([10, 11, 12, 13], tokens_per_s=10_000)
    request = _request(stop_token_ids=frozenset({12}))
    outputs = await _collect(engine.generate(request))
    assert [o.token_ids for o in outputs] == [(10,), (11,), ()]
    assert outputs[-1].finish_reason is FinishReason.STOP


@pytest.mark.anyio
async def test_ignore_eos_generates_past_end_of_sequence() -> None:
    engine = ScriptedEngine([10, TOKENIZER.eos_id, 11], tokens_per_s=10_000)
    outputs = await _collect(engine.generate(_request(ignore_eos=True)))
    assert [o.token_ids for o in outputs] == [(10,), (1,), (11,), ()]


@pytest.mark.anyio
async def test_script_may_be_a_function_of_the_request() -> None:
    def echo(request: GenerateRequest) -> list[int]:
        return list(request.prompt_token_ids[1:])

    engine = ScriptedEngine(echo, tokens_per_s=10_000)
    outputs = await _collect(engine.generate(_request()))
    assert [i for o in outputs for i in o.token_ids] == [100, 101, 102]
    assert outputs[-1].finish_reason is FinishReason.STOP


@pytest.mark.anyio
async def test_context_window_ends_the_sequence_with_length() -> None:
    engine = ScriptedEngine([20] * 50, context_length=10, tokens_per_s=10_000)
    outputs = await _collect(engine.generate(_request()))
    assert len(outputs) == 10 - len(PROMPT)
    assert outputs[-1].finish_reason is FinishReason.LENGTH


def test_rate_paces_the_steps() -> None:
    clock = ManualClock(start=100.0)
    engine = ScriptedEngine([20] * 10, tokens_per_s=200, clock=clock)
    seen = _timed(engine, clock, _request())
    clock.advance(0.0049)
    assert seen == []
    clock.advance(1.0)
    times = [at - 100.0 for at, _ in seen]
    assert times == pytest.approx([0.005 * k for k in range(1, 12)])
    assert seen[-1][1] == EngineOutput((), FinishReason.STOP)


def test_a_late_step_catches_up_by_one_step_at_most() -> None:
    # A loop that ran late: the schedule is absolute, but never more than one
    # step behind, so a stalled loop does not release a burst of tokens.
    clock = ManualClock()
    engine = ScriptedEngine([20] * 10, tokens_per_s=100, clock=clock)
    seen = _timed(engine, clock, _request())
    clock.advance(0.01)
    assert len(seen) == 1
    clock.jump(0.5)  # the loop was busy for 0.5 s: no timer ran
    clock.step()
    assert len(seen) == 2  # the late step
    clock.step()
    assert len(seen) == 3  # one more was due by now; the rest keep the rate
    clock.step()
    assert len(seen) == 3


@pytest.mark.anyio
async def test_engine_generates_without_a_reader() -> None:
    engine = ScriptedEngine([20] * 5, tokens_per_s=10_000)
    outputs = engine.generate(_request())
    await wait_until(lambda: engine.stats().finished_requests == 1)
    assert engine.stats().generated_tokens == 5
    assert len(await _collect(outputs)) == 6


# --- accounting, abort -------------------------------------------------------


@pytest.mark.anyio
async def test_kv_cells_are_prompt_plus_generated_of_running_sequences() -> None:
    engine = ScriptedEngine(_ids(DEFAULT_TEXT), tokens_per_s=100)
    outputs = engine.generate(_request())
    seen = 0
    async for output in outputs:
        seen += len(output.token_ids)
        stats = engine.stats()
        assert stats.kv_cells_used == len(PROMPT) + stats.generated_tokens
        assert stats.generated_tokens >= seen
        assert stats.running_ids == ("r",)
        if seen == 3:
            break
    engine.abort("r")
    await wait_until(lambda: engine.stats().running == 0)
    stats = engine.stats()
    assert stats.kv_cells_used == 0
    assert stats.prompt_tokens == len(PROMPT)
    assert stats.aborted_ids == ("r",)


def test_abort_mid_stream_stops_generation_and_counts_waste() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200, clock=clock)
    seen = _timed(engine, clock, _request())
    clock.advance(0.005)
    [(_, first)] = seen
    assert isinstance(first, EngineOutput)
    assert len(first.token_ids) == 1
    engine.abort("r")
    assert seen[1:] == [(0.005, None)]  # the outputs end, with nothing more
    stats = engine.stats()
    assert (stats.running, stats.kv_cells_used) == (0, 0)
    assert stats.aborted_requests == 1
    assert stats.aborted_ids == ("r",)
    assert stats.wasted_tokens == 1
    assert stats.generated_tokens == 2
    clock.advance(10.0)
    assert engine.stats().generated_tokens == 2
    assert len(seen) == 2


@pytest.mark.anyio
async def test_abort_mid_stream_ends_an_iterating_reader() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    outputs = engine.generate(_request())
    await anext(outputs)
    engine.abort("r")
    assert await _collect(outputs) == []
    assert engine.stats().running == 0


def test_abort_during_prefill_frees_the_prompt_before_any_token() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(prefill_delay_s=30, clock=clock)
    seen = _timed(engine, clock, _request())
    clock.advance(29.0)
    assert engine.stats().kv_cells_used == len(PROMPT)
    engine.abort("r")
    assert seen == [(29.0, None)]
    clock.advance(10.0)
    assert seen == [(29.0, None)]
    stats = engine.stats()
    assert stats.kv_cells_used == 0
    assert stats.generated_tokens == 0
    assert stats.wasted_tokens == 0
    assert stats.aborted_ids == ("r",)


@pytest.mark.anyio
async def test_abort_in_the_queue_removes_the_request_at_once() -> None:
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1)
    engine.generate(_request("a"))
    queued = engine.generate(_request("b"))
    assert (engine.stats().running, engine.stats().queued) == (1, 1)
    engine.abort("b")
    assert engine.stats().queued == 0
    with anyio.fail_after(1):
        assert await _collect(queued) == []
    assert engine.stats().prompt_tokens == len(PROMPT)
    await engine.aclose()


@pytest.mark.anyio
async def test_queued_request_runs_when_a_slot_frees() -> None:
    engine = ScriptedEngine([20, 21], max_running=1, tokens_per_s=10_000)
    first = engine.generate(_request("a"))
    second = engine.generate(_request("b"))
    assert engine.stats().queued == 1
    assert len(await _collect(first)) == 3
    assert len(await _collect(second)) == 3
    assert engine.stats().finished_requests == 2


@pytest.mark.anyio
async def test_abort_is_idempotent_and_a_no_op_after_finish() -> None:
    engine = ScriptedEngine([20], tokens_per_s=10_000)
    await _collect(engine.generate(_request()))
    engine.abort("r")
    engine.abort("r")
    engine.abort("never-seen")
    stats = engine.stats()
    assert stats.aborted_requests == 0
    assert stats.finished_requests == 1

    engine = ScriptedEngine(never_finishes=True)
    engine.generate(_request())
    engine.abort("r")
    engine.abort("r")
    assert engine.stats().aborted_requests == 1


@pytest.mark.anyio
async def test_closing_the_iterator_early_aborts_the_sequence() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=1000)
    outputs = engine.generate(_request())
    async for _ in outputs:
        break
    await outputs.aclose()  # type: ignore[attr-defined]
    assert engine.stats().aborted_ids == ("r",)


# --- faults ------------------------------------------------------------------


@pytest.mark.anyio
async def test_fail_at_step_raises_from_the_iterator_after_earlier_steps() -> None:
    engine = ScriptedEngine(fail_at_step=2, tokens_per_s=10_000)
    outputs = engine.generate(_request())
    received: list[EngineOutput] = []

    async def read() -> None:
        async for output in outputs:
            received.append(output)

    with pytest.raises(EngineError, match="step 2"):
        await read()
    assert len(received) == 2
    stats = engine.stats()
    assert stats.failed_requests == 1
    assert stats.kv_cells_used == 0
    assert stats.running == 0


def test_stall_delays_one_step() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(
        [20] * 4, stall_at_step=2, stall_s=0.6, tokens_per_s=1000, clock=clock
    )
    seen = _timed(engine, clock, _request())
    clock.advance(5.0)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(seen)]
    assert gaps == pytest.approx([0.001, 0.601, 0.001, 0.001])


def test_prefill_delay_comes_before_the_first_token() -> None:
    clock = ManualClock()
    engine = ScriptedEngine([20], prefill_delay_s=0.1, tokens_per_s=10_000, clock=clock)
    seen = _timed(engine, clock, _request())
    clock.advance(0.1)
    assert seen == []
    clock.advance(0.0001)
    assert [item for _, item in seen] == [EngineOutput((20,))]
    assert seen[0][0] == pytest.approx(0.1001)


def test_a_prefill_delay_with_a_floor_waits_only_for_long_prompts() -> None:
    """``prefill-delay:S:N``: a prompt of N tokens or more waits S seconds, a
    shorter one starts at once (a long prompt's slow prefill among quick ones)."""
    clock = ManualClock()
    engine = ScriptedEngine(
        [20], prefill_delay_s=5.0, prefill_min_tokens=3, tokens_per_s=10_000,
        clock=clock,
    )  # fmt: skip
    short = _timed(engine, clock, GenerateRequest("s", (5, 6), SamplingParams(8)))
    long = _timed(engine, clock, GenerateRequest("l", (5, 6, 7), SamplingParams(8)))
    clock.advance(0.0001)
    assert [item for _, item in short][:1] == [EngineOutput((20,))]
    assert long == []
    clock.advance(4.9)
    assert long == []
    clock.advance(0.2)
    assert [item for _, item in long][:1] == [EngineOutput((20,))]


@pytest.mark.anyio
async def test_never_finishes_ignores_max_tokens_and_stop_tokens() -> None:
    engine = ScriptedEngine([20, TOKENIZER.eos_id], never_finishes=True)
    outputs = engine.generate(_request(max_tokens=2))
    received = [await anext(outputs) for _ in range(6)]
    assert all(o.finish_reason is None for o in received)
    assert [o.token_ids[0] for o in received[:2]] == [20, TOKENIZER.eos_id]
    engine.abort("r")
    await wait_until(lambda: engine.stats().running == 0)


@pytest.mark.anyio
async def test_full_queue_is_refused_at_once() -> None:
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1, max_queued=1)
    engine.generate(_request("a"))
    engine.generate(_request("b"))
    with pytest.raises(EngineUnavailable, match="limit 1"):
        engine.generate(_request("c"))
    assert engine.stats().queued == 1
    await engine.aclose()


@pytest.mark.anyio
async def test_aclose_aborts_everything_and_refuses_new_requests() -> None:
    engine = ScriptedEngine(never_finishes=True)
    outputs = engine.generate(_request())
    with anyio.fail_after(1):
        await engine.aclose()
    stats = engine.stats()
    assert (stats.running, stats.kv_cells_used) == (0, 0)
    assert await _collect(outputs) == []
    with pytest.raises(EngineUnavailable):
        engine.generate(_request("other"))


@pytest.mark.anyio
async def test_bad_requests_are_refused_at_once() -> None:
    engine = ScriptedEngine(prefill_delay_s=30)
    engine.generate(_request())
    with pytest.raises(EngineError, match="already running"):
        engine.generate(_request())
    with pytest.raises(EngineError, match="no tokens"):
        engine.generate(GenerateRequest("x", (), SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="tokens_per_s"):
        ScriptedEngine(tokens_per_s=0)
    await engine.aclose()


@pytest.mark.anyio
async def test_a_crashing_script_fails_the_sequence_instead_of_hanging(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def crashing(request: GenerateRequest) -> Iterator[int]:
        yield 20
        raise RuntimeError("script bug")

    engine = ScriptedEngine(crashing, tokens_per_s=10_000)
    outputs = engine.generate(_request())
    assert await anext(outputs) == EngineOutput((20,))
    with anyio.fail_after(1), pytest.raises(EngineError, match="script raised"):
        await anext(outputs)
    await wait_until(lambda: "script bug" in caplog.text)  # logged
    assert engine.stats().kv_cells_used == 0


def test_parse_faults_reads_the_cli_specs() -> None:
    specs = ["error-after:3", "prefill-delay:0.5", "stall:2:1.5", "never-finishes"]
    assert parse_faults([*specs, "grammar-crash"]) == {
        "fail_at_step": 3,
        "prefill_delay_s": 0.5,
        "prefill_min_tokens": 0,
        "stall_at_step": 2,
        "stall_s": 1.5,
        "never_finishes": True,
        "crash_on_grammar": True,
    }
    assert parse_faults([]) == {}
    floor = {"prefill_delay_s": 2.5, "prefill_min_tokens": 1000}
    assert parse_faults(["prefill-delay:2.5:1000"]) == floor


def test_an_engine_that_crashes_on_grammars_claims_them() -> None:
    """So that a server asks it to compile one (in the engine process: the
    crash is ``tests/integration/test_engine_process.py``'s)."""
    assert not ScriptedEngine().capabilities.grammars
    assert ScriptedEngine(crash_on_grammar=True).capabilities.grammars


@pytest.mark.parametrize(
    "spec", ["explode", "error-after:x", "stall:1", "stall:a:1", "grammar-crash:1"]
)
def test_parse_faults_refuses_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match=f"got {spec!r}"):
        parse_faults([spec])


def test_parse_faults_reads_a_seeded_error_rate() -> None:
    specs = ["error-rate:0.25:4", "seed:7"]
    assert parse_faults(specs) == {"fail_rate": 0.25, "fail_at_step": 4, "seed": 7}
    assert parse_faults([*specs, "error-after:2"]) == {"fail_at_step": 2, "seed": 7}


@pytest.mark.parametrize("spec", ["error-rate:0.5", "error-rate:1.5:3", "seed:x"])
def test_parse_faults_refuses_bad_error_rates(spec: str) -> None:
    with pytest.raises(ValueError, match=f"got {spec!r}"):
        parse_faults([spec])


async def _ends(engine: ScriptedEngine, request_id: str) -> str:
    """How one sequence of ``engine`` ends: ``failed`` or ``finished``."""
    request = GenerateRequest(request_id, (5, 6), SamplingParams(max_tokens=8))
    try:
        async for _ in engine.generate(request):
            pass
    except EngineError:
        return "failed"
    return "finished"


@pytest.mark.anyio
async def test_error_rate_fails_a_seeded_share_of_sequences_at_its_step() -> None:
    """The same seed fails the same submissions; others run to their end."""
    runs = []
    for _ in range(2):
        engine = ScriptedEngine(
            fail_at_step=2, fail_rate=0.3, seed=11, tokens_per_s=math.inf
        )
        runs.append([await _ends(engine, f"r{i}") for i in range(200)])
        assert engine.stats().failed_requests == runs[-1].count("failed")
        assert engine.stats().kv_cells_used == 0
        await engine.aclose()
    assert runs[0] == runs[1]
    assert 30 <= runs[0].count("failed") <= 90, runs[0].count("failed")


# --- the clock ---------------------------------------------------------------


def test_an_endless_sequence_at_an_unbounded_rate_yields_between_steps() -> None:
    timers = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=math.inf, clock=timers)
    seen = _timed(engine, timers, _request())
    for steps in range(1, 201):
        timers.step()
        assert len(seen) == steps  # one token per loop iteration, never a burst
    engine.abort("r")
    assert engine.stats().running == 0


def test_advance_refuses_to_spin_on_callbacks_that_keep_falling_due() -> None:
    timers = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=math.inf, clock=timers)
    engine.generate(_request())
    with pytest.raises(RuntimeError, match="time does not move"):
        timers.advance(0, max_steps=50)


@pytest.mark.anyio
async def test_on_the_event_loop_an_unbounded_rate_lets_other_tasks_run() -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=math.inf)
    outputs = engine.generate(_request())
    assert isinstance(outputs, SequenceOutputs)
    seen: list[OutputItem] = []
    outputs.listen(seen.append)
    turns = 0

    async def other_task() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.get_running_loop().create_task(other_task())
    try:
        await wait_until(lambda: turns >= 100 and len(seen) >= 100)
    finally:
        task.cancel()
    engine.abort("r")
    assert engine.stats().running == 0


@pytest.mark.anyio
async def test_aborted_requests_during_a_long_prefill_leave_the_clock() -> None:
    engine = ScriptedEngine(prefill_delay_s=30, max_running=1000, max_queued=0)
    for i in range(200):
        engine.generate(_request(f"r{i}"))
    for i in range(200):
        engine.abort(f"r{i}")
    assert engine._clock is not None
    assert len(engine._clock) <= 64
    assert engine.stats().kv_cells_used == 0


@pytest.mark.anyio
async def test_an_abort_while_the_last_output_is_delivered_is_no_abort() -> None:
    # A stop string that completes on the final (max_tokens) token: the server
    # aborts from inside the listener, but the sequence had already finished.
    engine = ScriptedEngine([20] * 10, tokens_per_s=10_000)
    outputs = engine.generate(_request(max_tokens=4))
    assert isinstance(outputs, SequenceOutputs)
    seen: list[OutputItem] = []

    def listener(item: OutputItem) -> None:
        seen.append(item)
        if isinstance(item, EngineOutput) and item.finish_reason is not None:
            engine.abort("r")

    outputs.listen(listener)
    await wait_until(lambda: engine.stats().finished_requests == 1)
    stats = engine.stats()
    assert (stats.aborted_requests, stats.aborted_ids) == (0, ())
    assert (stats.generated_tokens, stats.wasted_tokens) == (4, 0)
    assert stats.running == 0
