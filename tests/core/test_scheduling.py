"""BatchScheduler without a model: admission by KV cells, step plans, aborts."""

from __future__ import annotations

import pytest

from sluicegate.core.errors import EngineUnavailable, RequestError
from sluicegate.core.events import FinishReason
from sluicegate.core.scheduling import BatchScheduler, Phase, PlannedChunk, Scheduled

EOS = 99


def _scheduler(
    kv_cells: int = 100, slots: int = 2, step_tokens: int = 8, queue_limit: int = 4
) -> BatchScheduler[Scheduled]:
    return BatchScheduler(
        kv_cells=kv_cells, slots=slots, step_tokens=step_tokens, queue_limit=queue_limit
    )


def _seq(name: str, prompt_len: int = 3, max_tokens: int = 5) -> Scheduled:
    prompt = tuple(range(1, prompt_len + 1))
    return Scheduled(name, prompt, max_tokens, frozenset({EOS}))


def _shape(plan: list[PlannedChunk[Scheduled]]) -> list[tuple[str, int, int, bool]]:
    return [
        (c.seq.request_id, len(c.tokens), c.first_pos, c.wants_logits) for c in plan
    ]


def _run_step(scheduler: BatchScheduler[Scheduled], token: int = 7) -> list[str]:
    """One step: plan, advance, accept ``token`` where logits were wanted; the
    ids that ended are released and returned."""
    plan = scheduler.plan()
    scheduler.advance(plan)
    ended = []
    for chunk in plan:
        if chunk.wants_logits and scheduler.accept(chunk.seq, token) is not None:
            scheduler.release(chunk.seq)
            ended.append(chunk.seq.request_id)
    return ended


def test_admission_is_fifo_by_kv_cells_and_nobody_overtakes_the_head() -> None:
    scheduler = _scheduler(kv_cells=20, slots=4)
    big, small, tiny = _seq("big", 10, 5), _seq("small", 6, 4), _seq("tiny", 1, 1)
    for seq in (big, small, tiny):
        scheduler.submit(seq)
    assert scheduler.admit() == [big]  # 15 reserved; small needs 10 of 5 left
    assert scheduler.reserved_cells == 15
    assert list(scheduler.waiting) == [small, tiny]  # tiny would fit: it waits
    assert scheduler.admit() == []
    scheduler.release(big)
    assert scheduler.admit() == [small, tiny]
    assert (small.phase, tiny.phase) == (Phase.PREFILL, Phase.PREFILL)
    assert {small.slot, tiny.slot} <= {0, 1, 2, 3}
    assert small.slot != tiny.slot


def test_admission_needs_a_free_slot() -> None:
    scheduler = _scheduler(slots=1)
    a, b = _seq("a"), _seq("b")
    scheduler.submit(a)
    scheduler.submit(b)
    assert scheduler.admit() == [a]
    assert scheduler.admit() == []
    scheduler.release(a)
    assert scheduler.admit() == [b]
    assert b.slot == a.slot == 0


def test_requests_that_can_never_run_or_do_not_fit_the_queue_are_refused() -> None:
    scheduler = _scheduler(kv_cells=10, queue_limit=1)
    with pytest.raises(RequestError, match="do not fit the 10-token context"):
        scheduler.check((1,) * 6, 5)
    with pytest.raises(RequestError, match="no tokens"):
        scheduler.check((), 1)
    scheduler.check((1,) * 5, 5)
    scheduler.submit(_seq("a"))
    with pytest.raises(EngineUnavailable, match="the limit is 1"):
        scheduler.submit(_seq("b"))
    scheduler.admit()
    with pytest.raises(RequestError, match="already running"):
        scheduler.submit(_seq("a"))
    with pytest.raises(ValueError, match="slots"):
        _scheduler(slots=4, step_tokens=3)


def test_a_step_decodes_every_running_sequence_then_chunks_prompts() -> None:
    scheduler = _scheduler(slots=3, step_tokens=8)
    a, b, c = _seq("a", 3), _seq("b", 10), _seq("c", 4)
    for seq in (a, b, c):
        scheduler.submit(seq)
    scheduler.admit()
    plan = scheduler.plan()
    # a's whole prompt, then 5 of b's 10 tokens; c waits for budget.
    assert _shape(plan) == [("a", 3, 0, True), ("b", 5, 0, False)]
    assert scheduler.advance(plan) == 8
    assert scheduler.accept(a, 7) is None
    assert (a.phase, b.phase, b.n_prompt_done) == (Phase.DECODE, Phase.PREFILL, 5)
    plan = scheduler.plan()
    # c's 4 tokens do not fit the 2 left: a prompt no longer than chunk_tokens
    # (here step_tokens) is never cut, so it waits whole for the next step.
    assert _shape(plan) == [("a", 1, 3, True), ("b", 5, 5, True)]
    assert plan[0].tokens == (7,)
    assert plan[1].tokens == tuple(range(6, 11))
    assert scheduler.advance(plan) == 5
    assert scheduler.kv_cells_used == 3 + 10
    scheduler.accept(a, 7)
    scheduler.accept(b, 7)
    assert _shape(scheduler.plan()) == [
        ("a", 1, 4, True),
        ("b", 1, 10, True),
        ("c", 4, 0, True),
    ]


def test_accept_ends_a_sequence_at_a_stop_id_or_at_max_tokens() -> None:
    scheduler = _scheduler()
    a, b = _seq("a", 1, 3), _seq("b", 1, 3)
    scheduler.submit(a)
    scheduler.submit(b)
    scheduler.admit()
    scheduler.advance(scheduler.plan())
    assert scheduler.accept(a, 7) is None
    assert scheduler.accept(b, 7) is None
    assert scheduler.accept(a, EOS) is FinishReason.STOP
    assert scheduler.accept(b, 7) is None
    assert scheduler.accept(b, 7) is FinishReason.LENGTH
    assert (a.n_generated, b.n_generated) == (2, 3)


def test_a_sequence_runs_to_its_end_and_gives_its_cells_back() -> None:
    scheduler = _scheduler(kv_cells=8, slots=1)
    seq = _seq("a", 3, 5)
    scheduler.submit(seq)
    scheduler.admit()
    ended: list[str] = []
    steps = 0
    while not ended:
        ended = _run_step(scheduler)
        steps += 1
    assert ended == ["a"]
    assert steps == 5  # one prefill step (which samples), four decode steps
    assert (seq.phase, scheduler.reserved_cells, scheduler.idle) == (
        Phase.DONE,
        0,
        True,
    )
    assert scheduler.get("a") is None


def test_abort_in_the_queue_removes_the_sequence_at_once() -> None:
    scheduler = _scheduler(slots=1)
    a, b = _seq("a"), _seq("b")
    scheduler.submit(a)
    scheduler.submit(b)
    scheduler.admit()
    assert scheduler.abort("b") is b
    assert b.phase is Phase.DONE
    assert list(scheduler.waiting) == []
    assert scheduler.abort("b") is None  # idempotent
    assert scheduler.abort("unknown") is None
    assert scheduler.reap() == []


def test_abort_in_prefill_leaves_at_the_next_reap_before_any_token() -> None:
    scheduler = _scheduler(step_tokens=4)
    seq = _seq("a", 10)
    scheduler.submit(seq)
    scheduler.admit()
    scheduler.advance(scheduler.plan())  # 4 of 10 prompt tokens
    assert scheduler.abort("a") is None  # flagged, still running
    assert seq.phase is Phase.PREFILL
    assert scheduler.abort("a") is None
    assert scheduler.reap() == [seq]
    assert (seq.phase, seq.n_generated, scheduler.reserved_cells) == (Phase.DONE, 0, 0)
    assert scheduler.plan() == []


def test_abort_in_decode_makes_the_tokens_of_a_running_step_waste() -> None:
    scheduler = _scheduler(slots=1)
    seq, queued = _seq("a", 2, 10), _seq("b")
    scheduler.submit(seq)
    scheduler.submit(queued)
    scheduler.admit()
    _run_step(scheduler)
    plan = scheduler.plan()  # the step is planned (running) when the abort comes
    scheduler.abort("a")
    scheduler.advance(plan)
    assert scheduler.accept(seq, EOS) is None  # waste: it ends nothing
    assert seq.n_generated == 2
    assert scheduler.reap() == [seq]
    assert scheduler.admit() == [queued]  # the slot and cells came back
    assert queued.slot == 0


def test_drain_removes_everything_and_flag_all_flags_it() -> None:
    scheduler = _scheduler(slots=1)
    a, b = _seq("a"), _seq("b")
    scheduler.submit(a)
    scheduler.submit(b)
    scheduler.admit()
    assert list(scheduler) == [a, b]
    scheduler.flag_all()
    assert a.abort_requested
    assert b.abort_requested
    assert scheduler.drain() == ([a], [b])
    assert scheduler.idle
    assert (a.phase, b.phase) == (Phase.DONE, Phase.DONE)
