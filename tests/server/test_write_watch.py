"""The per-stream heartbeat and stuck-write timer (``_WriteWatch``)."""

from __future__ import annotations

import asyncio

import pytest

from sluicegate.server.streaming import StreamLimits, _WriteWatch
from tests.polling import wait_until

pytestmark = pytest.mark.anyio


def _silent(watch: _WriteWatch) -> bool:
    return watch.silent


async def test_it_pokes_the_writer_after_each_silence() -> None:
    loop = asyncio.get_running_loop()
    pokes: list[float] = []
    limits = StreamLimits(heartbeat_interval_s=0.05, stuck_timeout_s=30)
    start = loop.time()
    watch = _WriteWatch(limits, lambda: pokes.append(loop.time()), lambda: None)
    try:
        await wait_until(lambda: len(pokes) == 1)
        assert pokes[0] - start >= 0.05 - 0.002
        assert _silent(watch)
        watch.writing()
        watch.wrote()  # the heartbeat went out
        assert not _silent(watch)
        await wait_until(lambda: len(pokes) == 2)
        assert pokes[1] - pokes[0] >= 0.05 - 0.002
    finally:
        watch.cancel()


async def test_a_write_stuck_right_after_a_heartbeat_is_caught_within_its_limit() -> (
    None
):
    # The heartbeat interval is longer than the stuck limit: the heartbeat's own
    # write must still be checked within 1.25 x the stuck limit, not one
    # heartbeat interval later. The bound leaves a busy machine's loop most of a
    # second of lag, far more than 1.25 x 0.08 s needs, yet well under 1 s.
    loop = asyncio.get_running_loop()
    poked = asyncio.Event()
    stuck_at: list[float] = []
    limits = StreamLimits(heartbeat_interval_s=1.0, stuck_timeout_s=0.08)
    watch = _WriteWatch(limits, poked.set, lambda: stuck_at.append(loop.time()))
    try:
        await asyncio.wait_for(poked.wait(), 5)
        watch.writing()  # ... and the client accepts nothing
        started = loop.time()
        await wait_until(lambda: bool(stuck_at))
        assert 0.08 - 0.002 <= stuck_at[0] - started < 0.5
    finally:
        watch.cancel()


async def test_a_write_that_ends_in_time_is_not_stuck() -> None:
    # Each write takes a third of the limit (two thirds of it left for a busy
    # loop's lag); together they take longer than the limit.
    stuck: list[bool] = []
    limits = StreamLimits(heartbeat_interval_s=0.02, stuck_timeout_s=0.3)
    watch = _WriteWatch(limits, lambda: None, lambda: stuck.append(True))
    try:
        for _ in range(4):
            watch.writing()
            await asyncio.sleep(0.1)
            watch.wrote()
        await asyncio.sleep(0.35)
        assert stuck == []
    finally:
        watch.cancel()


def test_the_timer_does_not_spin_on_a_clock_of_whole_milliseconds() -> None:
    # uvloop's clock counts milliseconds: a timer due at t can read t - 1 ms when
    # it fires. A check that re-armed itself "now" would run on every loop
    # iteration until the clock ticked.
    uvloop = pytest.importorskip("uvloop")
    checks = 0

    class Counting(_WriteWatch):
        def _check(self) -> None:
            nonlocal checks
            checks += 1
            super()._check()

    async def main() -> None:
        limits = StreamLimits(heartbeat_interval_s=0.02, stuck_timeout_s=30)
        heartbeats: list[Counting] = []
        watch = Counting(limits, lambda: heartbeats[0].wrote(), lambda: None)
        heartbeats.append(watch)
        await asyncio.sleep(0.3)
        watch.cancel()

    uvloop.run(main())
    # About 15 heartbeats in 0.3 s; a spinning timer would check hundreds of
    # times. Fewer is no fault (a busy machine runs the loop late).
    assert 2 <= checks < 40
