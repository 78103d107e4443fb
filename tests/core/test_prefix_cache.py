"""PrefixCache and the scheduler's prefix reuse, without a model."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.prefix_cache import PrefixCache, common_prefix
from sluicegate.core.scheduling import BatchScheduler, Phase, Scheduled

EOS = 99


@given(
    st.lists(st.integers(0, 3), max_size=40), st.lists(st.integers(0, 3), max_size=40)
)
def test_common_prefix_is_the_longest_shared_start(a: list[int], b: list[int]) -> None:
    n = common_prefix(a, b)
    assert a[:n] == b[:n]
    assert n == min(len(a), len(b)) or a[n] != b[n]


def test_a_prompt_gets_the_slot_of_its_longest_prefix_and_the_rest_is_trimmed() -> None:
    cache = PrefixCache(min_tokens=2)
    cache.keep(0, (1, 2, 3, 4, 5))
    cache.keep(1, (1, 2, 9))
    assert cache.cells == 8
    assert cache.claim((1, 2, 3, 7, 7), [0, 1, 2]) == (0, 3)
    assert cache.take_trims() == [(0, 3)]  # positions 3.. of slot 0 go
    assert cache.cells == 3  # slot 1's cells stay held
    assert cache.held(0) == ()


def test_the_whole_prompt_is_never_reused_one_token_is_read_again() -> None:
    cache = PrefixCache(min_tokens=2)
    cache.keep(0, (1, 2, 3, 4))
    assert cache.claim((1, 2, 3), [0]) == (0, 2)
    assert cache.take_trims() == [(0, 2)]


def test_a_short_match_takes_an_empty_slot_and_leaves_the_cache_alone() -> None:
    cache = PrefixCache(min_tokens=3)
    cache.keep(0, (1, 2, 5, 6))
    assert cache.claim((1, 2, 7, 8), [0, 1]) == (1, 0)
    assert cache.take_trims() == []
    assert cache.held(0) == (1, 2, 5, 6)


def test_without_an_empty_slot_the_oldest_cache_is_given_up() -> None:
    cache = PrefixCache(min_tokens=3)
    cache.keep(1, (5, 5, 5))
    cache.keep(0, (6, 6, 6))
    assert cache.claim((7, 7, 7, 7), [0, 1]) == (1, 0)
    assert cache.take_trims() == [(1, 0)]
    assert cache.cells == 3


def test_eviction_drops_whole_caches_oldest_first_until_they_fit() -> None:
    cache = PrefixCache()
    cache.keep(0, (1,) * 5)
    cache.keep(1, (2,) * 5)
    cache.keep(2, (3,) * 5)
    cache.evict(9)
    assert cache.take_trims() == [(0, 0), (1, 0)]
    assert cache.cells == 5
    assert cache.held(2) == (3,) * 5


def test_a_disabled_cache_trims_every_slot_left_at_once() -> None:
    cache = PrefixCache(enabled=False)
    cache.keep(0, (1, 2, 3))
    assert cache.cells == 0
    assert cache.take_trims() == [(0, 0)]
    assert cache.claim((1, 2, 3), [0]) == (0, 0)


def _run(scheduler: BatchScheduler[Scheduled], seq: Scheduled, token: int = 7) -> None:
    """Admit ``seq`` alone and run it to its end, ``token`` every step."""
    scheduler.submit(seq)
    assert scheduler.admit() == [seq]
    while seq.phase is not Phase.DONE:
        plan = scheduler.plan()
        scheduler.advance(plan)
        for chunk in plan:
            if chunk.wants_logits and scheduler.accept(chunk.seq, token):
                scheduler.release(chunk.seq)


def test_the_scheduler_reuses_a_finished_sequences_cells_for_the_next_prompt() -> None:
    scheduler = BatchScheduler[Scheduled](
        kv_cells=100,
        slots=2,
        step_tokens=8,
        queue_limit=4,
        prefix_cache=PrefixCache(min_tokens=4),
    )
    first = Scheduled("a", tuple(range(10)), 3, frozenset({EOS}))
    _run(scheduler, first)
    # 10 prompt tokens and the 2 of 3 generated tokens that were fed back.
    assert scheduler.cache.held(first.slot) == (*range(10), 7, 7)
    assert scheduler.kv_cells_used == 0
    second = Scheduled("b", (*range(10), 7, 1, 2), 2, frozenset({EOS}))
    scheduler.submit(second)
    assert scheduler.admit() == [second]
    assert (second.slot, second.n_cached, second.n_prompt_done) == (first.slot, 11, 11)
    assert scheduler.take_trims() == [(first.slot, 11)]
    plan = scheduler.plan()
    assert [(c.tokens, c.first_pos) for c in plan] == [((1, 2), 11)]


def test_admission_evicts_held_cells_that_its_reservation_needs() -> None:
    scheduler = BatchScheduler[Scheduled](
        kv_cells=30, slots=2, step_tokens=8, queue_limit=4, prefix_cache=PrefixCache()
    )
    _run(scheduler, Scheduled("a", tuple(range(20)), 2, frozenset({EOS})))
    assert scheduler.cache.cells == 21
    scheduler.take_trims()
    big = Scheduled("b", tuple(range(50, 60)), 5, frozenset({EOS}))
    scheduler.submit(big)
    assert scheduler.admit() == [big]  # 15 reserved: 21 held cells do not fit
    assert scheduler.cache.cells == 0
    assert scheduler.take_trims() == [(0 if big.slot else 1, 0)]


def test_drain_holds_no_cells() -> None:
    scheduler = BatchScheduler[Scheduled](
        kv_cells=100, slots=2, step_tokens=8, queue_limit=4, prefix_cache=PrefixCache()
    )
    _run(scheduler, Scheduled("a", tuple(range(20)), 2, frozenset({EOS})))
    scheduler.drain()
    assert scheduler.cache.cells == 0


def test_prompt_chunks_shrink_to_chunk_tokens_while_more_sequences_decode() -> None:
    scheduler = BatchScheduler[Scheduled](
        kv_cells=100, slots=5, step_tokens=8, queue_limit=4, chunk_tokens=3
    )
    first = [Scheduled(f"a{i}", (1, 2), 5, frozenset({EOS})) for i in range(3)]
    for seq in first:
        scheduler.submit(seq)
    scheduler.admit()
    plan = scheduler.plan()
    assert [len(c.tokens) for c in plan] == [2, 2, 2]  # nobody decodes: all at once
    scheduler.advance(plan)
    for seq in first:
        scheduler.accept(seq, 7)
    long, short = (
        Scheduled(n, tuple(range(k)), 5, frozenset({EOS}))
        for n, k in [("b", 8), ("c", 2)]
    )
    scheduler.submit(long)
    scheduler.submit(short)
    scheduler.admit()
    # Three decode, two prompts are read: the cut one reads at most 3 tokens a
    # step; the short one ends its prompt.
    assert [len(c.tokens) for c in scheduler.plan()] == [1, 1, 1, 3, 2]


def test_claim_without_a_free_slot_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="free slot"):
        PrefixCache().claim((1, 2, 3), [])
