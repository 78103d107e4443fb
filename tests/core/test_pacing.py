"""PrefillPacer and BatchScheduler's paced chunks, fed made-up step times.

The times are exact binary fractions (or a linear model of a step's cost), so
no assertion depends on a machine's speed or on floating-point rounding beyond
a relative 1e-9.
"""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sluicegate.core.pacing import PrefillPacer
from sluicegate.core.scheduling import BatchScheduler, Phase, PlannedChunk, Scheduled

EOS = 99


def _pacer(ratio: float = 2.0, first: int = 8) -> PrefillPacer:
    return PrefillPacer(step_ratio=ratio, first_chunk_tokens=first)


def test_the_first_chunk_holds_until_both_kinds_of_step_were_seen() -> None:
    pacer = _pacer()
    assert pacer.chunk_tokens(4) == 8
    pacer.observe(4, 8, 0.5)  # mixed, but nothing to subtract from it yet
    assert pacer.chunk_tokens(4) == 8
    assert pacer.prompt_token_s() is None
    pacer.observe(4, 0, 0.25)
    assert pacer.decode_step_s(4) == 0.25
    assert pacer.chunk_tokens(4) == 8


def test_the_chunk_fills_the_budget_at_the_measured_cost_and_grows_by_doubling() -> (
    None
):
    # 4 sequences decode in 0.25 s; a prompt token adds 1/128 s. Ratio 2: a
    # mixed step may add 0.25 s, which is 32 prompt tokens.
    pacer = _pacer()
    pacer.observe(4, 0, 0.25)
    sizes = []
    for _ in range(4):
        chunk = pacer.chunk_tokens(4)
        sizes.append(chunk)
        pacer.observe(4, chunk, 0.25 + chunk / 128)
    assert sizes == [8, 16, 32, 32]
    assert pacer.prompt_token_s() == 1 / 128


def test_a_costlier_prompt_token_shrinks_the_chunk_and_a_lower_ratio_too() -> None:
    pacer = _pacer(ratio=1.5, first=32)
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 32, 0.25 + 32 / 64)  # 1/64 s per token
    # 0.125 s of room at 1/64 s a token
    assert pacer.chunk_tokens(4) == 8


def test_fewer_decoding_sequences_make_a_smaller_budget() -> None:
    pacer = _pacer(first=16)
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 16, 0.25 + 16 / 128)
    assert pacer.chunk_tokens(4) == 32
    assert pacer.decode_step_s(2) == 0.125
    assert pacer.chunk_tokens(2) == 16


def test_fewer_decoding_sequences_than_full_batch_keep_its_budget() -> None:
    pacer = PrefillPacer(step_ratio=2.0, first_chunk_tokens=16, full_batch=4)
    pacer.observe(1, 0, 1 / 16)  # one sequence: 1/16 s
    pacer.observe(1, 16, 1 / 16 + 16 / 256)
    # Sized as if 4 decoded: 4/16 s of room at 1/256 s a token, capped at
    # twice the last chunk; 6 decoding sequences get 6/16 s.
    assert pacer.chunk_tokens(1) == 32
    pacer.observe(1, 32, 1 / 16 + 32 / 256)
    assert pacer.chunk_tokens(1) == 64
    assert pacer.chunk_tokens(3) == 64
    pacer.observe(1, 64, 1 / 16 + 64 / 256)
    assert pacer.chunk_tokens(6) == 96


def test_a_slow_step_shrinks_the_chunk_to_one_token_at_least() -> None:
    pacer = _pacer()
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 8, 1000.0)
    assert pacer.chunk_tokens(4) == 1


def test_the_chunk_never_falls_below_min_chunk_tokens_but_for_a_probe() -> None:
    pacer = PrefillPacer(
        step_ratio=1.5, first_chunk_tokens=4, min_chunk_tokens=6, probe_every=2
    )
    assert pacer.chunk_tokens(4) == 6  # the first chunk, raised to the floor
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 6, 1000.0)  # a step slowed by other work
    assert pacer.chunk_tokens(4) == 6
    pacer.observe(4, 6, 0.25)
    assert pacer.chunk_tokens(4) == 0  # the probe


def test_mixed_steps_no_slower_than_decoding_alone_double_the_chunk() -> None:
    pacer = _pacer()
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 8, 0.25)
    assert pacer.prompt_token_s() is None
    assert pacer.chunk_tokens(4) == 16


def test_steps_with_nothing_decoding_or_no_time_teach_nothing() -> None:
    pacer = _pacer()
    pacer.observe(0, 512, 2.0)
    pacer.observe(4, 0, -1.0)
    assert pacer.decode_step_s(4) is None
    assert pacer.chunk_tokens(4) == 8


def test_the_decode_estimate_is_a_median_over_the_window() -> None:
    pacer = PrefillPacer(step_ratio=2.0, first_chunk_tokens=8, decode_window=3)
    for elapsed_s in (0.125, 9.0, 0.25, 0.5):  # the first one leaves the window
        pacer.observe(1, 0, elapsed_s)
    assert pacer.decode_step_s(1) == 0.5  # 9.0, 0.25, 0.5: the slow step moves little
    pacer.observe(1, 0, 0.25)
    assert pacer.decode_step_s(1) == 0.25  # 0.25, 0.5, 0.25


@pytest.mark.parametrize(
    ("ratio", "counts"),
    [
        (1.0, (8, 1, 4, 4, 4, 1)),
        (2.0, (0, 1, 4, 4, 4, 1)),
        (2.0, (8, 0, 4, 4, 4, 1)),
        (2.0, (8, 1, 0, 4, 4, 1)),
        (2.0, (8, 1, 4, 4, 0, 1)),
        (2.0, (8, 1, 4, 4, 4, 0)),
    ],
)
def test_bad_settings_are_a_value_error(
    ratio: float, counts: tuple[int, int, int, int, int, int]
) -> None:
    first, least, window, decode_window, probe_every, full_batch = counts
    with pytest.raises(ValueError, match="expected step_ratio > 1"):
        PrefillPacer(
            step_ratio=ratio,
            first_chunk_tokens=first,
            min_chunk_tokens=least,
            window=window,
            decode_window=decode_window,
            probe_every=probe_every,
            full_batch=full_batch,
        )


def test_after_probe_every_mixed_steps_one_decodes_alone_and_is_measured() -> None:
    pacer = PrefillPacer(step_ratio=2.0, first_chunk_tokens=8, probe_every=3)
    pacer.observe(4, 0, 0.25)
    for _ in range(3):
        pacer.observe(4, 8, 0.25 + 8 / 128)
    assert pacer.chunk_tokens(4) == 0
    # The decode-only step is slower now (the prompt's cells): measured, and the
    # chunk is sized against it, so the growth is not counted as the prompt's.
    pacer.observe(4, 0, 0.5)
    pacer.observe(4, 0, 0.5)
    assert pacer.decode_step_s(4) == 0.5
    assert pacer.chunk_tokens(4) == 16


def test_a_mixed_step_faster_than_a_stale_estimate_calls_a_probe_that_replaces_it() -> (
    None
):
    # 16 sequences decode in 1/8 s, a prompt token adds 1/256 s; five
    # decode-only steps of 1/4 s (the machine was busy) come just before the
    # prompt. Its first 8 tokens take 1/8 + 8/256 s, less than the 1/4 s
    # estimate: the next step decodes alone, and its time is the estimate.
    pacer = PrefillPacer(step_ratio=1.5, first_chunk_tokens=8)
    for _ in range(5):
        pacer.observe(16, 0, 0.25)
    sizes = []
    for _ in range(5):
        chunk = pacer.chunk_tokens(16)
        sizes.append(chunk)
        pacer.observe(16, chunk, 0.125 + chunk / 256)
    # Without the probe the 8 tokens seem to cost less than nothing, and the
    # chunk doubles each step (16, 32, 64, ...). With it, 1/16 s of room at
    # 1/256 s a token is 16 tokens.
    assert sizes == [8, 0, 16, 16, 16]
    assert pacer.decode_step_s(16) == 0.125
    assert pacer.prompt_token_s() == 1 / 256


def test_a_stale_estimate_is_taken_back_from_the_steps_measured_against_it() -> None:
    # Mixed steps measured against a decode-only estimate of 1/4 s, which the
    # decode-only steps after them bring down to 1/8 s: what their prompt
    # tokens add is counted from 1/8 s now (the larger cost, the smaller chunk).
    pacer = _pacer(first=32)
    pacer.observe(4, 0, 0.25)
    for _ in range(3):
        pacer.observe(4, 32, 0.25 + 32 / 128)
    assert pacer.prompt_token_s() == 1 / 128
    for _ in range(3):
        pacer.observe(4, 0, 0.125)
    assert pacer.decode_step_s(4) == 0.125
    assert pacer.prompt_token_s() == (0.5 - 0.125) / 32
    assert pacer.chunk_tokens(4) == 10  # 1/8 s of room at 3/256 s a token


def test_a_decode_step_grown_during_the_read_shrinks_the_chunk_not_the_gaps() -> None:
    # Before the prompt, 4 sequences decode in 0.25 s; while it is read (a probe
    # after each mixed step) a decode-only step grows to 0.375 s. The mixed step
    # is held to twice the step before the read (0.5 s), not to twice 0.375 s.
    pacer = PrefillPacer(step_ratio=2.0, first_chunk_tokens=32, probe_every=1)
    pacer.observe(4, 0, 0.25)
    pacer.observe(4, 0, 0.25)
    for _ in range(5):
        pacer.observe(4, 32, 0.5)
        assert pacer.chunk_tokens(4) == 0
        pacer.observe(4, 0, 0.375)
    decode_s, token_s = pacer.decode_step_s(4), pacer.prompt_token_s()
    assert decode_s == 0.375
    assert token_s is not None
    chunk = pacer.chunk_tokens(4)
    assert decode_s + chunk * token_s <= 0.5 * (1 + 1e-9)
    assert decode_s + (chunk + 1) * token_s > 0.5
    # Two decode-only steps in a row: no read under way, the step measured now
    # is the one before the next read.
    pacer.observe(4, 0, 0.375)
    assert pacer.chunk_tokens(4) == min(64, int(0.375 / token_s))


@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 16),
            st.integers(0, 512),
            st.floats(-1.0, 10.0, allow_nan=False),
        ),
        max_size=60,
    ),
    decoding=st.integers(1, 16),
    least=st.integers(1, 64),
)
def test_any_step_times_give_a_probe_or_a_chunk_within_its_bounds(
    steps: list[tuple[int, int, float]], decoding: int, least: int
) -> None:
    pacer = PrefillPacer(step_ratio=2.0, first_chunk_tokens=8, min_chunk_tokens=least)
    seen = [(d, p) for d, p, s in steps if d > 0 and s >= 0]
    mixed = [p for _, p in seen if p > 0]
    in_a_row = len(seen) - max(
        (i + 1 for i, (_, p) in enumerate(seen) if p <= 0), default=0
    )
    faster = False  # the last step seen was mixed and faster than the estimate
    for d, p, s in steps:
        estimate_s = pacer.decode_step_s(d) if d > 0 else None
        if d > 0 and s >= 0:
            faster = p > 0 and estimate_s is not None and s < estimate_s
        pacer.observe(d, p, s)
    chunk = pacer.chunk_tokens(decoding)
    if in_a_row >= 8 or faster:
        assert chunk == 0
    else:
        assert least <= chunk <= max(8, least, 2 * max(mixed[-16:], default=0))


@given(
    overhead_s=st.floats(0.0, 0.1),
    seq_s=st.floats(1e-4, 0.1),
    token_s=st.floats(1e-5, 0.05),
    ratio=st.floats(1.1, 4.0),
    decoding=st.integers(1, 16),
)
@example(  # 8.999... tokens fit; the pacer's own sums make it 9
    overhead_s=0.0, seq_s=1e-4, token_s=1e-5, ratio=1.9, decoding=1
)
def test_with_a_linear_cost_the_mixed_step_stays_in_budget_and_fills_it(
    overhead_s: float, seq_s: float, token_s: float, ratio: float, decoding: int
) -> None:
    decode_s = overhead_s + decoding * seq_s
    pacer = _pacer(ratio=ratio)
    pacer.observe(decoding, 0, decode_s)
    pacer.observe(decoding, 8, decode_s + 8 * token_s)  # the first chunk, a guess
    for _ in range(20):  # doubling from 8 tokens reaches any size in time
        chunk = pacer.chunk_tokens(decoding)
        within = decode_s + chunk * token_s <= ratio * decode_s * (1 + 1e-9)
        assert within or chunk == 1
        pacer.observe(decoding, chunk, decode_s + chunk * token_s)
    pacer.observe(decoding, 0, decode_s)  # a probe may be due
    # The ideal count, to a relative 1e-9: the pacer measures its cost per token
    # from sums of times, so a count a hair under an integer may come out whole.
    ideal = (ratio - 1) * decode_s / token_s
    fewest, most = int(ideal * (1 - 1e-9)) - 1, int(ideal * (1 + 1e-9))
    assert max(1, fewest) <= pacer.chunk_tokens(decoding) <= max(1, most)


@given(
    seq_s=st.floats(1e-4, 0.1),
    token_s=st.floats(1e-5, 0.05),
    ratio=st.floats(1.1, 4.0),
    decoding=st.integers(1, 16),
    full_batch=st.integers(1, 16),
)
def test_with_a_per_sequence_cost_the_decoders_delay_is_a_full_batchs_at_most(
    seq_s: float, token_s: float, ratio: float, decoding: int, full_batch: int
) -> None:
    # Each decoding sequence waits what the chunk adds: what a step of
    # max(decoding, full_batch) sequences may add at step_ratio, within a token
    # (so summed over them no more than a full batch's wait, and each waits no
    # less than at step_ratio of its own step).
    decode_s = decoding * seq_s
    pacer = PrefillPacer(step_ratio=ratio, first_chunk_tokens=8, full_batch=full_batch)
    pacer.observe(decoding, 0, decode_s)
    pacer.observe(decoding, 8, decode_s + 8 * token_s)
    for _ in range(20):
        chunk = pacer.chunk_tokens(decoding)
        pacer.observe(decoding, chunk, decode_s + chunk * token_s)
    pacer.observe(decoding, 0, decode_s)
    added_s = pacer.chunk_tokens(decoding) * token_s
    room_s = (ratio - 1) * max(decoding, full_batch) * seq_s
    assert added_s <= room_s * (1 + 1e-9) or added_s == token_s
    assert added_s + 2 * token_s > room_s


STALE = {
    "overhead_s": st.floats(0.0, 0.1),
    "seq_s": st.floats(1e-4, 0.1),
    "token_s": st.floats(1e-5, 0.05),
    "ratio": st.floats(1.1, 4.0),
    "decoding": st.integers(1, 16),
    "slower": st.floats(1.0, 16.0),
    "slow_steps": st.integers(1, 8),
    "warm_steps": st.integers(0, 20),
}


def _stale_pacer(
    overhead_s: float,
    seq_s: float,
    token_s: float,
    ratio: float,
    decoding: int,
    slower: float,
    slow_steps: int,
    warm_steps: int,
) -> tuple[PrefillPacer, float, int]:
    """A pacer that read ``warm_steps`` chunks at a linear cost, then saw
    ``slow_steps`` decode-only steps ``slower`` times the true one (the
    machine was busy); with the true decode-only step (seconds) and the
    largest chunk it gave before those (tokens)."""
    decode_s = overhead_s + decoding * seq_s
    pacer = _pacer(ratio=ratio)
    pacer.observe(decoding, 0, decode_s)
    largest = 8
    for _ in range(warm_steps):
        chunk = pacer.chunk_tokens(decoding)
        largest = max(largest, chunk)
        pacer.observe(decoding, chunk, decode_s + chunk * token_s)
    for _ in range(slow_steps):
        pacer.observe(decoding, 0, slower * decode_s)
    return pacer, decode_s, largest


@given(**STALE)
def test_a_stale_too_slow_decode_estimate_cannot_make_the_chunk_grow_unbounded(
    overhead_s: float,
    seq_s: float,
    token_s: float,
    ratio: float,
    decoding: int,
    slower: float,
    slow_steps: int,
    warm_steps: int,
) -> None:
    # Once the machine is fast again, the chunk stays within a few times the
    # larger of the chunks before and what fits beside the stale estimate at
    # the true cost of a prompt token; it does not double step by step.
    pacer, decode_s, largest = _stale_pacer(
        overhead_s, seq_s, token_s, ratio, decoding, slower, slow_steps, warm_steps
    )
    fits_stale = (ratio - 1) * slower * decode_s / token_s
    for _ in range(60):
        chunk = pacer.chunk_tokens(decoding)
        assert chunk <= 4 * max(largest, fits_stale)
        pacer.observe(decoding, chunk, decode_s + chunk * token_s)


@given(**STALE)
def test_a_mixed_step_faster_than_the_estimate_is_followed_by_a_true_one(
    overhead_s: float,
    seq_s: float,
    token_s: float,
    ratio: float,
    decoding: int,
    slower: float,
    slow_steps: int,
    warm_steps: int,
) -> None:
    # The first mixed step faster than the decode-only estimate is followed
    # by a probe; from its time on, the estimate is the true one and the next
    # chunk fits the true step's budget.
    pacer, decode_s, _ = _stale_pacer(
        overhead_s, seq_s, token_s, ratio, decoding, slower, slow_steps, warm_steps
    )
    for _ in range(60):
        estimate_s = pacer.decode_step_s(decoding)
        chunk = pacer.chunk_tokens(decoding)
        elapsed_s = decode_s + chunk * token_s
        pacer.observe(decoding, chunk, elapsed_s)
        if chunk and estimate_s is not None and elapsed_s < estimate_s:
            break
    else:
        return  # never faster: the estimate was not too slow for these steps
    assert pacer.chunk_tokens(decoding) == 0
    pacer.observe(decoding, 0, decode_s)
    assert pacer.decode_step_s(decoding) == pytest.approx(decode_s, rel=1e-9)
    chunk = pacer.chunk_tokens(decoding)
    assert decode_s + chunk * token_s <= ratio * decode_s * (1 + 1e-9) or chunk == 1


def _paced_scheduler(
    step_tokens: int = 64, slots: int = 3
) -> BatchScheduler[Scheduled]:
    return BatchScheduler(
        kv_cells=1000,
        slots=slots,
        step_tokens=step_tokens,
        queue_limit=4,
        chunk_tokens=8,
        step_ratio=2.0,
    )


# Step times the pacer may have learnt before a test's prompts arrive:
# (decoding sequences, prompt tokens, seconds), negative and zero times too.
LEARNT = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 64),
        st.floats(-1.0, 10.0, allow_nan=False),
    ),
    max_size=30,
)


def _taught(
    learnt: list[tuple[int, int, float]],
    *,
    kv_cells: int,
    slots: int,
    step_tokens: int,
    queue_limit: int,
    ratio: float,
) -> BatchScheduler[Scheduled]:
    """A paced scheduler (first chunk 8 tokens) whose pacer saw ``learnt``."""
    scheduler = BatchScheduler[Scheduled](
        kv_cells=kv_cells,
        slots=slots,
        step_tokens=step_tokens,
        queue_limit=queue_limit,
        chunk_tokens=8,
        step_ratio=ratio,
    )
    assert scheduler.pacer is not None
    for decoding, prompt_tokens, seconds in learnt:
        scheduler.pacer.observe(decoding, prompt_tokens, seconds)
    return scheduler


def _take_tokens(
    scheduler: BatchScheduler[Scheduled], plan: list[PlannedChunk[Scheduled]]
) -> None:
    """Each chunk that asked for logits takes token 7; a sequence that ends leaves."""
    for chunk in plan:
        if chunk.wants_logits and scheduler.accept(chunk.seq, 7) is not None:
            scheduler.release(chunk.seq)


def test_a_step_ratio_of_one_or_less_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="expected step_ratio > 1"):
        BatchScheduler[Scheduled](
            kv_cells=10, slots=1, step_tokens=4, queue_limit=1, step_ratio=1.0
        )


def _step_time_s(plan_shape: list[tuple[Phase, int]]) -> float:
    """A made-up cost: 1/16 s per decoding sequence, 1/256 s per prompt token."""
    return sum(1 / 16 if phase is Phase.DECODE else n / 256 for phase, n in plan_shape)


def _decoding(scheduler: BatchScheduler[Scheduled], n: int) -> list[Scheduled]:
    """``n`` sequences admitted, read and decoding (their first token taken)."""
    seqs = [Scheduled(f"d{i}", (1, 2), 50, frozenset({EOS})) for i in range(n)]
    for seq in seqs:
        scheduler.submit(seq)
    scheduler.admit()
    scheduler.advance(scheduler.plan())
    for seq in seqs:
        scheduler.accept(seq, 7)
    return seqs


def test_the_scheduler_paces_a_long_prompt_among_decoding_sequences() -> None:
    scheduler = _paced_scheduler(slots=4)
    decoding = _decoding(scheduler, 2)
    chunks: list[int] = []
    for step in range(14):
        if step == 2:
            scheduler.submit(Scheduled("long", tuple(range(600)), 5, frozenset()))
            scheduler.admit()
        plan = scheduler.plan()
        shape = [(c.seq.phase, len(c.tokens)) for c in plan]
        if step >= 2:
            chunks.append(sum(n for phase, n in shape if phase is Phase.PREFILL))
        scheduler.advance(plan, _step_time_s(shape))
        for seq in decoding:
            scheduler.accept(seq, 7)
    # Two decoding sequences take 2/16 s, but the chunk is sized for slots - 1
    # = 3 of them: ratio 2 leaves 3/16 s, 48 tokens, reached by doubling; the
    # ninth step decodes alone, to measure a decode-only step again.
    assert chunks == [8, 16, 32, 48, 48, 48, 48, 48, 0, 48, 48, 48]


def test_without_step_times_the_scheduler_keeps_chunk_tokens() -> None:
    scheduler = _paced_scheduler()
    decoding = _decoding(scheduler, 2)
    scheduler.submit(Scheduled("long", tuple(range(300)), 5, frozenset()))
    scheduler.admit()
    for _ in range(3):
        plan = scheduler.plan()
        assert [len(c.tokens) for c in plan] == [1, 1, 8]
        scheduler.advance(plan)
        for seq in decoding:
            scheduler.accept(seq, 7)


def test_prompts_as_many_as_the_decoding_sequences_get_the_whole_step() -> None:
    # One sequence decodes and three long prompts wait (four arrived together):
    # they are read oldest first with all the step holds, then, once more
    # sequences decode than prompts are read, paced again.
    scheduler = _paced_scheduler(slots=4)
    decoding = _decoding(scheduler, 1)
    for i in range(3):
        scheduler.submit(Scheduled(f"p{i}", tuple(range(100)), 5, frozenset()))
    scheduler.admit()
    cuts = []
    for _ in range(5):
        plan = scheduler.plan()
        cuts.append([(c.seq.request_id, len(c.tokens)) for c in plan[len(decoding) :]])
        scheduler.advance(plan, _step_time_s([(c.seq.phase, 1) for c in plan]))
        for chunk in plan:
            if chunk.wants_logits:
                scheduler.accept(chunk.seq, 7)
                if chunk.seq not in decoding:
                    decoding.append(chunk.seq)
    assert cuts == [
        [("p0", 63)],
        [("p0", 37), ("p1", 26)],
        [("p1", 62)],  # 2 decode, 2 are read: still the whole step
        [("p1", 12), ("p2", 50)],
        [("p2", 8)],  # 3 decode, 1 is read: paced (the first chunk)
    ]


@given(
    prompts=st.lists(st.integers(1, 200), min_size=1, max_size=6),
    times=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=20),
)
def test_any_step_times_read_every_prompt_once_within_the_step_budget(
    prompts: list[int], times: list[float]
) -> None:
    scheduler = _paced_scheduler(step_tokens=32)
    seqs = [
        Scheduled(f"s{i}", tuple(range(n)), 3, frozenset())
        for i, n in enumerate(prompts)
    ]
    for seq in seqs[:4]:
        scheduler.submit(seq)
    read, steps = 0, 0
    pending = seqs[4:]
    while not scheduler.idle:
        if pending and len(scheduler.waiting) < 4:
            scheduler.submit(pending.pop(0))
        scheduler.admit()
        plan = scheduler.plan()
        assert 0 < sum(len(c.tokens) for c in plan) <= 32
        for c in plan:  # a prompt's logits are read after its last token only
            read_all = c.first_pos + len(c.tokens) >= len(c.seq.prompt)
            assert c.wants_logits == read_all
        read += scheduler.advance(plan, times[steps % len(times)])
        _take_tokens(scheduler, plan)
        steps += 1
        assert steps <= 2 * (sum(prompts) + 3 * len(prompts))  # progress
    assert read == sum(prompts)
    assert all(seq.phase is Phase.DONE for seq in seqs)


@given(
    learnt=LEARNT,
    times=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=8),
    ratio=st.sampled_from([1.1, 1.5, 2.0, 4.0]),
    length=st.integers(1, 8),
    long_length=st.integers(0, 300),
    arrives=st.integers(1, 12),
)
@example(  # a slow mixed step was learnt: the pacer asks for its floor, 2 tokens
    learnt=[(1, 0, 0.125), (1, 8, 1000.0)],
    times=[0.125],
    ratio=1.5,
    length=8,
    long_length=0,
    arrives=1,
)
def test_two_identical_short_prompts_are_cut_alike_whatever_the_pacer_learnt(
    learnt: list[tuple[int, int, float]],
    times: list[float],
    ratio: float,
    length: int,
    long_length: int,
    arrives: int,
) -> None:
    # The first is read while nothing decodes, its twin among decoding steps
    # (and maybe beside a long prompt): llama.cpp's arithmetic depends on how a
    # prompt is cut, so a greedy answer is the same only if both are read whole.
    scheduler = _taught(
        learnt, kv_cells=1000, slots=3, step_tokens=16, queue_limit=4, ratio=ratio
    )
    prompt = tuple(range(length))
    first = Scheduled("first", prompt, 40, frozenset())
    twin = Scheduled("twin", prompt, 3, frozenset())
    scheduler.submit(first)
    if long_length:
        scheduler.submit(Scheduled("long", tuple(range(long_length)), 3, frozenset()))
    cuts: dict[str, list[int]] = {"first": [], "twin": []}
    step = 0
    while twin.phase is not Phase.DONE:
        if step == arrives:
            scheduler.submit(twin)
        scheduler.admit()
        plan = scheduler.plan()
        decoding = any(c.seq.phase is Phase.DECODE for c in plan)
        for chunk in plan:
            seq = chunk.seq
            if seq.phase is not Phase.PREFILL:
                continue
            left = len(seq.prompt) - seq.n_prompt_done
            if seq.request_id in cuts:
                cuts[seq.request_id].append(len(chunk.tokens))
            elif decoding:  # the long prompt: never below a quarter of 8
                assert len(chunk.tokens) >= min(2, left)
        scheduler.advance(plan, times[step % len(times)])
        _take_tokens(scheduler, plan)
        step += 1
        assert step <= 400  # progress
    assert cuts == {"first": [length], "twin": [length]}


@given(
    learnt=LEARNT,
    times=st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=1, max_size=8),
    decoders=st.integers(1, 4),
    lengths=st.lists(st.integers(1, 120), min_size=1, max_size=4),
)
@example(  # a step 5e-324 s long: the cost per token rounds to 0 s
    learnt=[], times=[5e-324], decoders=2, lengths=[73]
)
def test_prompts_beside_decoding_ones_are_paced_together_or_given_the_step(
    learnt: list[tuple[int, int, float]],
    times: list[float],
    decoders: int,
    lengths: list[int],
) -> None:
    # While more sequences decode than prompts are read, the pacer's chunk is
    # the step's, not each prompt's (four chunks would make a step four times
    # as long as planned); else the prompts get all the step holds. Either
    # way the oldest prompt is read first.
    scheduler = _taught(
        learnt, kv_cells=2000, slots=8, step_tokens=48, queue_limit=8, ratio=1.5
    )
    assert scheduler.pacer is not None
    _decoding(scheduler, decoders)
    for i, n in enumerate(lengths):
        scheduler.submit(Scheduled(f"p{i}", tuple(range(n)), 2, frozenset()))
    scheduler.admit()
    step = 0
    while any(s.phase is Phase.PREFILL for s in scheduler):
        decoding = sum(s.phase is Phase.DECODE for s in scheduler)
        reading = sum(s.phase is Phase.PREFILL for s in scheduler)
        most = scheduler.pacer.chunk_tokens(decoding)
        running = scheduler.running.values()
        left = {s.request_id: len(s.prompt) - s.n_prompt_done for s in running}
        plan = scheduler.plan()
        read = [c for c in plan if c.seq.phase is Phase.PREFILL]
        cut = [c for c in read if left[c.seq.request_id] > 8]  # not short
        if decoding > reading:
            assert sum(len(c.tokens) for c in cut) <= most
        else:  # the step is full, or what is not read whole did not fit it
            room = 48 - sum(len(c.tokens) for c in plan)
            whole = {c.seq.request_id for c in read if c.wants_logits}
            unread = [n for rid, n in left.items() if n and rid not in whole]
            assert not room or all(room < n <= 8 for n in unread)
        assert all(c.wants_logits for c in cut[:-1])  # the oldest first
        scheduler.advance(plan, times[step % len(times)])
        _take_tokens(scheduler, plan)
        step += 1
        assert step <= 400  # progress
