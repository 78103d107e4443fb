"""LlamaCppEngine on the real default model (Gemma 3 270M through llama.cpp)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from sluicegate.core.errors import EngineError, EngineUnavailable, RequestError
from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.base import EngineStats, GenerateRequest, SamplingParams
from sluicegate.engines.llamacpp.engine import LlamaCppEngine
from sluicegate.model import default_model_path

pytestmark = [pytest.mark.llamacpp, pytest.mark.anyio]

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def engine() -> Iterator[LlamaCppEngine]:
    eng = LlamaCppEngine(
        default_model_path(),
        n_ctx=4096,
        n_parallel=2,
        step_tokens=128,
        chunk_tokens=32,
        step_ratio=2.0,
        queue_limit=4,
        prefix_cache=True,
    )
    yield eng
    asyncio.run(eng.aclose())


def request(
    engine: LlamaCppEngine, rid: str, text: str = PROMPT, **params: object
) -> GenerateRequest:
    """Greedy, 8 tokens, past end tokens: the tests count tokens, and whether (and
    where) the model would end its answer is its own choice, not theirs."""
    ids = engine.tokenizer.encode(text, add_special=True, parse_special=False)
    defaults = {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
    sampling = SamplingParams(**{**defaults, **params})  # type: ignore[arg-type]
    return GenerateRequest(rid, tuple(ids), sampling)


async def collect(outputs: AsyncIterator[EngineOutput]) -> list[EngineOutput]:
    return [out async for out in outputs]


async def poll(predicate: Callable[[], bool], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true after {limit_s} s")
        await asyncio.sleep(0.005)


# Liveness deadlines only: an engine step takes tens of ms here, but seconds on a
# machine whose cores are shared with other work.
LIVENESS_S = 30.0


async def wait_idle(engine: LlamaCppEngine, limit_s: float = LIVENESS_S) -> EngineStats:
    await poll(lambda: engine.stats().running == engine.stats().queued == 0, limit_s)
    return engine.stats()


async def test_greedy_generation_is_deterministic_and_ends_with_length(
    engine: LlamaCppEngine,
) -> None:
    first = await collect(engine.generate(request(engine, "det-1")))
    second = await collect(engine.generate(request(engine, "det-2")))
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert sum(len(o.token_ids) for o in first) == 8
    assert [o.finish_reason for o in first] == [None] * 7 + [FinishReason.LENGTH]
    text = b"".join(engine.tokenizer.pieces[t] for o in first for t in o.token_ids)
    assert text.decode("utf-8").strip()  # real text came out
    stats = await wait_idle(engine)
    assert stats.kv_cells_used == 0


async def test_stop_token_id_ends_the_sequence_and_is_the_last_token(
    engine: LlamaCppEngine,
) -> None:
    greedy = await collect(engine.generate(request(engine, "stop-ref")))
    ids = [t for o in greedy for t in o.token_ids]
    # The last token that had not come before: the sequence must end right there
    # (a token the model wrote earlier too would end it sooner).
    at = max(i for i, t in enumerate(ids) if t not in ids[:i])
    stop = frozenset({ids[at]})
    outs = await collect(
        engine.generate(request(engine, "stop-id", stop_token_ids=stop))
    )
    assert outs[-1].finish_reason is FinishReason.STOP
    assert outs[-1].token_ids == (ids[at],)
    assert [t for o in outs for t in o.token_ids] == ids[: at + 1]


async def test_abort_while_decoding_frees_cells_at_the_next_step(
    engine: LlamaCppEngine,
) -> None:
    outputs = engine.generate(request(engine, "abort-decode", max_tokens=2000))
    await outputs.__anext__()
    assert "abort-decode" in engine.stats().running_ids
    before = engine.stats().generated_tokens
    engine.abort("abort-decode")
    engine.abort("abort-decode")  # idempotent
    stats = await wait_idle(engine)
    assert "abort-decode" in stats.aborted_ids
    assert stats.kv_cells_used == 0
    assert stats.generated_tokens - before <= 2  # at most the step in flight
    assert await collect(outputs) == []  # the iterator ends without a finish


async def test_abort_during_prefill_stops_after_the_current_chunk(
    engine: LlamaCppEngine,
) -> None:
    long_prompt = "lighthouse keeper " * 600  # about 1,200 tokens: ten 128-token steps
    req = request(engine, "abort-prefill", text=long_prompt, max_tokens=4)
    task = asyncio.ensure_future(collect(engine.generate(req)))
    await poll(lambda: engine.stats().kv_cells_used > 0, limit_s=LIVENESS_S)
    assert 0 < engine.stats().kv_cells_used < len(req.prompt_token_ids)
    prompt_before = engine.stats().prompt_tokens
    engine.abort("abort-prefill")
    stats = await wait_idle(engine)
    assert stats.kv_cells_used == 0
    assert stats.generated_tokens == engine.stats().generated_tokens
    assert stats.prompt_tokens - prompt_before <= 128  # at most one more chunk
    assert await task == []


async def test_leaving_the_iterator_early_aborts_the_request(
    engine: LlamaCppEngine,
) -> None:
    outputs = engine.generate(request(engine, "leave-early", max_tokens=2000))
    await outputs.__anext__()
    await outputs.aclose()
    stats = await wait_idle(engine)
    assert "leave-early" in stats.aborted_ids
    assert stats.kv_cells_used == 0


async def test_two_sequences_decode_in_the_same_steps(engine: LlamaCppEngine) -> None:
    # Not compared with a lone run's tokens: llama.cpp's arithmetic depends on the
    # batch, so a batched greedy sequence may part ways with the lone one. The
    # step counter shows the batching: alone, each would take 8 steps.
    before = engine.stats().steps
    together = await asyncio.gather(
        collect(engine.generate(request(engine, "pair-a"))),
        collect(engine.generate(request(engine, "pair-b", text="Once upon a time"))),
    )
    assert [sum(len(o.token_ids) for o in outs) for outs in together] == [8, 8]
    assert all(o[-1].finish_reason is FinishReason.LENGTH for o in together)
    assert engine.stats().steps - before < 16
    assert (await wait_idle(engine)).kv_cells_used == 0


async def test_a_prompt_read_among_a_decoding_sequence_is_paced_by_step_times(
    engine: LlamaCppEngine,
) -> None:
    # What the chunks are depends on this machine's step times, so only that the
    # worker reports them (the pacer has a decode-only step's time) and that
    # both sequences come out whole is asserted.
    decoding = engine.generate(request(engine, "paced-a", max_tokens=12))
    await decoding.__anext__()
    long_prompt = "lighthouse keeper " * 75  # about 150 tokens: 32 first, then paced
    read = request(engine, "paced-b", text=long_prompt, max_tokens=2)
    outs = await asyncio.gather(collect(decoding), collect(engine.generate(read)))
    assert [sum(len(o.token_ids) for o in out) for out in outs] == [11, 2]
    pacer = engine._scheduler.pacer  # the engine's own; no public view of it
    assert pacer is not None
    step_s = pacer.decode_step_s(1)
    assert step_s is not None
    assert step_s > 0
    assert (await wait_idle(engine)).kv_cells_used == 0


async def test_requests_beyond_the_parallel_limit_wait_then_run(
    engine: LlamaCppEngine,
) -> None:
    outs = await asyncio.gather(
        *(collect(engine.generate(request(engine, f"q{i}"))) for i in range(4))
    )
    assert [len(o) for o in outs] == [8, 8, 8, 8]


async def test_a_full_queue_is_refused_at_once(engine: LlamaCppEngine) -> None:
    running = [
        engine.generate(request(engine, f"run{i}", max_tokens=400)) for i in range(2)
    ]
    for it in running:
        await it.__anext__()  # both sequence slots are now busy
    waiting = [
        engine.generate(request(engine, f"wait{i}", max_tokens=400)) for i in range(4)
    ]
    pending = [asyncio.ensure_future(it.__anext__()) for it in waiting]
    await asyncio.sleep(0.05)
    assert engine.stats().queued == 4
    with pytest.raises(EngineUnavailable, match="limit is 4"):
        engine.generate(request(engine, "one-too-many"))  # refused before any output
    for it in running:
        await it.aclose()
    for fut in pending:
        fut.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for it in waiting:
        await it.aclose()
    stats = await wait_idle(engine)
    assert stats.kv_cells_used == 0
    assert {"wait0", "wait3", "run0"} <= set(stats.aborted_ids)


async def test_a_prompt_that_cannot_fit_is_a_request_error(
    engine: LlamaCppEngine,
) -> None:
    with pytest.raises(RequestError, match="4096-token context"):
        engine.generate(request(engine, "too-long", max_tokens=5000))


async def test_a_failed_step_fails_its_batch_and_the_engine_keeps_serving(
    engine: LlamaCppEngine,
) -> None:
    outputs = engine.generate(request(engine, "doomed", max_tokens=500))
    await outputs.__anext__()
    engine.inject_fault(RuntimeError("injected"))
    with pytest.raises(EngineError, match="injected"):
        await collect(outputs)
    stats = await wait_idle(engine)
    assert stats.failed_requests >= 1
    assert stats.kv_cells_used == 0
    after = await collect(engine.generate(request(engine, "survivor")))
    assert after[-1].finish_reason is FinishReason.LENGTH


async def test_logprobs_come_with_each_token_when_asked(
    engine: LlamaCppEngine,
) -> None:
    outs = await collect(engine.generate(request(engine, "lp", logprobs=3)))
    for out in outs:
        assert out.logprobs is not None
        (lp,) = out.logprobs
        assert lp.token_id == out.token_ids[0]
        assert lp.logprob <= 0.0
        assert len(lp.top) == 3
        assert [p for _, p in lp.top] == sorted((p for _, p in lp.top), reverse=True)
        # greedy: the sampled token is the most likely one
        assert lp.top[0][0] == lp.token_id
        assert abs(lp.top[0][1] - lp.logprob) < 1e-9
    plain = await collect(engine.generate(request(engine, "no-lp")))
    assert all(o.logprobs is None for o in plain)


async def test_stats_count_steps_and_their_time(engine: LlamaCppEngine) -> None:
    before = engine.stats()
    await collect(engine.generate(request(engine, "timed")))
    after = engine.stats()
    assert after.steps - before.steps >= 8  # one prefill step, then one per token
    assert after.step_time_s > before.step_time_s


async def test_random_generate_and_abort_churn_leaves_no_cells_held(
    engine: LlamaCppEngine,
) -> None:
    """A seeded run of 40 random starts, aborts and early exits on the real model.

    How many requests finish depends on the machine's speed (a slow one refuses
    more starts with a full queue, and is still running more of them when an
    abort comes), so no count is asserted: every request that no abort named
    must finish, and every other one must finish or be aborted.
    """
    import random

    rng = random.Random(20261129)
    tasks: dict[str, asyncio.Task[list[EngineOutput]]] = {}
    refused: list[str] = []
    named: set[str] = set()
    for op in range(40):
        kind = rng.choice(["start", "start", "abort", "sleep"])
        if kind == "start":
            rid = f"churn{op}"
            req = request(engine, rid, max_tokens=rng.randint(1, 24))
            try:
                outputs = engine.generate(req)
            except EngineUnavailable:  # a full queue refuses at once
                refused.append(rid)
                continue
            tasks[rid] = asyncio.ensure_future(collect(outputs))
        elif kind == "abort" and tasks:
            named.add(rid := rng.choice(sorted(tasks)))
            engine.abort(rid)
        else:
            await asyncio.sleep(rng.uniform(0, 0.05))
    results = await asyncio.gather(*tasks.values())
    stats = await wait_idle(engine)
    assert stats.kv_cells_used == 0
    assert stats.running == 0
    assert stats.queued == 0
    for rid, outs in zip(tasks, results, strict=True):
        if not outs or outs[-1].finish_reason is None:
            assert rid in named, f"{rid} ended without a finish, and no abort named it"
            assert rid in stats.aborted_ids, f"{rid} ended without finish or abort"


async def test_a_shared_prefix_is_reused_and_its_cells_freed(
    engine: LlamaCppEngine,
) -> None:
    shared = "The keeper of the lighthouse wrote in the log every night: ships, " * 3
    cold = await collect(engine.generate(request(engine, "pfx-1", shared + "gulls")))
    other = await collect(engine.generate(request(engine, "pfx-2", shared + "and")))
    warm = await collect(engine.generate(request(engine, "pfx-3", shared + "gulls")))
    prefix = len(engine.tokenizer.encode(shared, add_special=True, parse_special=False))
    assert cold[0].cached_tokens == 0
    # The shared text's tokens, give or take the one where the endings join.
    assert prefix - 2 <= other[0].cached_tokens <= prefix
    assert prefix - 2 <= warm[0].cached_tokens <= prefix
    assert all(o.cached_tokens == 0 for o in warm[1:])
    stats = await wait_idle(engine)
    assert stats.kv_cells_used == 0


async def test_greedy_alone_draws_what_llama_cpps_greedy_chain_draws(
    engine: LlamaCppEngine,
) -> None:
    # Plain greedy takes the logits' argmax in Python; a zero logit bias sends
    # the same request through llama.cpp's sampler chain (bias, then greedy).
    # Each runs alone, so both read the same logits.
    plain = await collect(engine.generate(request(engine, "argmax", max_tokens=16)))
    chained = await collect(
        engine.generate(request(engine, "chain", max_tokens=16, logit_bias=((0, 0.0),)))
    )
    ids = [t for o in plain for t in o.token_ids]
    assert ids == [t for o in chained for t in o.token_ids]
    assert len(set(ids)) > 1  # real text, not one token repeated


async def test_the_window_only_cache_reads_long_prompts_and_frees_them() -> None:
    """With ``swa_full=False`` the sliding-window layers keep only the window's
    cells (llama-server's setting): a prompt past the window (512 on Gemma 3), read in
    chunks, answers; an abort then frees every cell in llama.cpp's memory, and
    the engine goes on serving."""
    import llama_cpp as llama

    with pytest.raises(ValueError, match="sliding-window"):
        LlamaCppEngine(default_model_path(), prefix_cache=True, swa_full=False)
    eng = LlamaCppEngine(default_model_path(), n_ctx=1024, n_parallel=2, swa_full=False)
    try:
        long_prompt = "lighthouse keeper " * 280  # about 560 tokens: five steps
        outputs = eng.generate(request(eng, "window", long_prompt, max_tokens=400))
        await outputs.__anext__()
        eng.abort("window")
        stats = await wait_idle(eng)
        assert stats.kv_cells_used == 0
        memory = llama.llama_get_memory(eng._ctx)  # the engine's own; no public view
        assert [llama.llama_memory_seq_pos_max(memory, s) for s in (0, 1)] == [-1, -1]
        after = await collect(eng.generate(request(eng, "after")))
        assert sum(len(o.token_ids) for o in after) == 8
    finally:
        await eng.aclose()
