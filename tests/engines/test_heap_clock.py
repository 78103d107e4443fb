"""HeapClock: callbacks in due order on one timer, voided entries skipped and dropped.

Run on a ``ManualClock`` (time steps when the test says so) or on the event loop
where the loop itself is what is tested.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.heap_clock import HeapClock


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass(eq=False)
class _Owner:
    name: str
    wake: int = 0
    pending: bool = False


def test_clock_calls_back_in_due_order_and_never_before_due() -> None:
    # "a" and "b" come after "c", the lane's last: they go to the heap, and
    # run in due order with the lane's entries.
    timers = ManualClock()
    clock = HeapClock[_Owner](timers)
    calls: list[tuple[str, float]] = []
    delays_s = {"c": 0.03, "a": 0.01, "b": 0.02, "b2": 0.02}
    for name, delay_s in delays_s.items():
        clock.at(
            delay_s,
            _Owner(name),
            lambda seq: calls.append((seq.name, timers.time())),
        )
    timers.advance(0.0099)
    assert calls == []
    timers.advance(1.0)
    assert calls == [
        ("a", 0.01),
        ("b", 0.02),
        ("b2", 0.02),
        ("c", 0.03),
    ]  # ties: as added


def test_clock_entries_added_while_it_fires_wait_for_the_next_iteration() -> None:
    # A callback that re-adds itself due now must not spin inside one firing:
    # each loop iteration (a step of the clock) runs it once.
    timers = ManualClock()
    clock = HeapClock[_Owner](timers)
    seen: list[int] = []

    def again(seq: _Owner) -> None:
        seen.append(len(seen))
        clock.at(timers.time(), seq, again)

    clock.at(timers.time(), _Owner("s"), again)
    for ran in range(1, 51):
        timers.step()
        assert len(seen) == ran


def test_clock_skips_voided_entries_and_still_runs_the_later_ones() -> None:
    timers = ManualClock()
    clock = HeapClock[_Owner](timers)
    calls: list[str] = []
    sequences = {name: _Owner(name) for name in "abcd"}
    for delay_s, name in enumerate("abcd", start=1):
        clock.at(
            delay_s * 0.005,
            sequences[name],
            lambda seq: calls.append(seq.name),
        )
    clock.void(sequences["a"])  # the earliest entry: the timer is armed for it
    clock.void(sequences["c"])
    timers.advance(1.0)
    assert calls == ["b", "d"]


def test_an_earlier_entry_added_later_rearms_the_clock_for_its_time() -> None:
    timers = ManualClock()
    clock = HeapClock[_Owner](timers)
    calls: list[tuple[str, float]] = []

    def record(seq: _Owner) -> None:
        calls.append((seq.name, timers.time()))

    clock.at(0.25, _Owner("late"), record)
    clock.at(0.01, _Owner("early"), record)
    timers.advance(1.0)
    assert calls == [("early", 0.01), ("late", 0.25)]


@pytest.mark.anyio
async def test_clock_drops_void_entries_once_they_are_most_of_the_heap() -> None:
    # Aborted sequences must not stay in the heap (with their prompts) until
    # their long prefill delay would have ended.
    loop = asyncio.get_running_loop()
    clock = HeapClock[_Owner](loop)
    sequences = [_Owner(f"s{i}") for i in range(200)]
    for seq in sequences:
        clock.at(loop.time() + 30, seq, lambda seq: None)
    for seq in sequences[:150]:
        clock.void(seq)
    assert len(clock) <= 100
    held = {entry[3] for entry in [*clock._heap, *clock._lane]}
    assert held >= set(sequences[150:])


@settings(max_examples=50)
@given(st.lists(st.tuples(st.integers(0, 40), st.booleans()), min_size=1, max_size=60))
def test_entries_run_in_due_then_added_order_whichever_place_holds_them(
    entries: list[tuple[int, bool]],
) -> None:
    # Dues in any order: those no earlier than the lane's last go there, the
    # others to the heap; they run as one (due, order) sequence, voided ones not.
    timers = ManualClock()
    clock = HeapClock[_Owner](timers)
    calls: list[str] = []
    owners = [_Owner(str(i)) for i in range(len(entries))]
    for owner, (due_ms, _) in zip(owners, entries, strict=True):
        clock.at(due_ms / 1000, owner, lambda seq: calls.append(seq.name))
    for owner, (_, voided) in zip(owners, entries, strict=True):
        if voided:
            clock.void(owner)
    timers.advance(1.0)
    expected = sorted(
        (due_ms, i) for i, (due_ms, voided) in enumerate(entries) if not voided
    )
    assert calls == [str(i) for _, i in expected]
    assert len(clock) == 0
