"""The per-stream heartbeat and stuck-write timer (``WriteWatch``), on a manual clock.

Time only moves when a test calls ``ManualClock.advance``, so no test depends on
how busy the machine is.
"""

from __future__ import annotations

import asyncio
import math

from sluicegate.engines.clocks import ManualClock
from sluicegate.server.streaming.write_watch import WriteWatch


class WholeMsClock(ManualClock):
    """A ``ManualClock`` that reads whole milliseconds, as uvloop's clock does: a
    callback due at ``t`` may read up to 1 ms less when it runs."""

    def time(self) -> float:
        return math.floor(super().time() * 1000) / 1000


def _silent(watch: WriteWatch) -> bool:
    return watch.silent  # read through a call: mypy narrows a property


# Times are binary fractions, so that sums of them are exact.


def test_it_pokes_the_writer_after_each_silence() -> None:
    clock = ManualClock()
    pokes: list[float] = []
    watch = WriteWatch(0.5, 32, lambda: pokes.append(clock.time()), lambda: None, clock)
    clock.advance(0.25)
    assert (pokes, _silent(watch)) == ([], False)
    clock.advance(0.25)
    assert pokes == [0.5]
    assert _silent(watch)
    watch.writing()
    watch.wrote()  # the heartbeat went out
    assert not _silent(watch)
    clock.advance(0.25)
    assert pokes == [0.5]
    clock.advance(0.25)
    assert pokes == [0.5, 1.0]
    watch.cancel()
    clock.advance(8)
    assert pokes == [0.5, 1.0]


def test_writes_put_off_the_next_poke() -> None:
    clock = ManualClock()
    pokes: list[float] = []
    watch = WriteWatch(0.5, 32, lambda: pokes.append(clock.time()), lambda: None, clock)
    for _ in range(10):
        clock.advance(0.25)
        watch.writing()
        watch.wrote()
    assert pokes == []
    clock.advance(0.5)
    assert pokes == [3.0]
    watch.cancel()


def test_a_write_stuck_right_after_a_heartbeat_is_caught_within_its_limit() -> None:
    # The heartbeat interval is longer than the stuck limit: the heartbeat's own
    # write must still be checked within 1.25 x the stuck limit, not one
    # heartbeat interval later.
    clock = ManualClock()
    poked: list[float] = []
    stuck_at: list[float] = []
    watch = WriteWatch(
        1.0,
        0.125,
        lambda: poked.append(clock.time()),
        lambda: stuck_at.append(clock.time()),
        clock,
    )
    clock.advance(1.0)
    assert poked == [1.0]
    watch.writing()  # ... and the client accepts nothing
    clock.advance(0.0625)
    assert stuck_at == []
    clock.advance(4)
    assert len(stuck_at) == 1  # reported once; the timer stops there
    assert 0.125 <= stuck_at[0] - 1.0 <= 1.25 * 0.125


def test_a_write_that_ends_in_time_is_not_stuck() -> None:
    # Each write takes a third of the limit; together they take longer than it.
    clock = ManualClock()
    stuck: list[float] = []
    watch = WriteWatch(
        0.0625, 0.375, lambda: None, lambda: stuck.append(clock.time()), clock
    )
    for _ in range(4):
        watch.writing()
        clock.advance(0.125)
        watch.wrote()
    clock.advance(0.5)
    assert stuck == []
    watch.writing()
    clock.advance(0.375)
    assert stuck == [1.375]
    watch.cancel()


def test_the_timer_does_not_spin_on_a_clock_of_whole_milliseconds() -> None:
    # uvloop's clock counts milliseconds: a timer due at t can read t - 1 ms when
    # it fires. A check that re-armed itself "now" would run again at once, on
    # and on, until the clock ticked.
    clock = WholeMsClock()
    checks = 0

    class Counting(WriteWatch):
        def _check(self) -> None:
            nonlocal checks
            checks += 1
            super()._check()

    heartbeats: list[Counting] = []
    watch = Counting(0.02, 30, lambda: heartbeats[0].wrote(), lambda: None, clock)
    heartbeats.append(watch)
    clock.advance(0.3)
    watch.cancel()
    # About one check per heartbeat, 15 in 0.3 s; a timer that spins makes
    # ``advance`` raise (time stands still while callbacks keep falling due).
    assert 14 <= checks <= 30


def test_it_runs_on_the_running_loop_by_default() -> None:
    async def main() -> float:
        watch = WriteWatch(10, 30, lambda: None, lambda: None)
        try:
            return watch.last_write - asyncio.get_running_loop().time()
        finally:
            watch.cancel()

    assert asyncio.run(main()) <= 0
