"""One stream's heartbeat and stuck-write timer, on an injectable clock.

``WriteWatch`` is told when each write starts and ends, and with one timer,
re-armed, pokes the writer after a silence and reports a write that waits for
the client too long. Its clock is any ``Timers`` (``time()`` and ``call_at()``):
the running asyncio loop in the server, a ``ManualClock`` in tests, so a test
steps time instead of sleeping against a limit.

Invariants:
    - At most one timer is armed, never in the past (no spinning on a clock that
      counts whole milliseconds).
    - A stuck write is caught within 1.25 x ``stuck_timeout_s``: the timer checks
      at least every quarter of it.

Spec: docs/DESIGN.md, "Slow consumers" and "The wire" (heartbeats).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sluicegate.engines.clocks import Timers

__all__ = ["CLOCK_SLACK_S", "WriteWatch"]

CLOCK_SLACK_S = 0.001
"""uvloop's clock counts whole milliseconds: a timer due at t may read t - 1 ms
when it fires. Comparisons allow that much, and no timer is armed in the past
(it would fire again at once until the clock ticks)."""


class WriteWatch:
    """One stream's heartbeat and stuck-write timer: one clock timer, re-armed.

    The writer calls ``writing()`` before each write and ``wrote()`` after it (two
    clock reads, no timer per write). The timer calls ``poke`` when nothing was
    written for ``heartbeat_interval_s``, and ``on_stuck`` when a write has
    waited for the client for ``stuck_timeout_s``.

    Args:
        heartbeat_interval_s: seconds of silence before ``poke()``.
        stuck_timeout_s: seconds one write may wait before ``on_stuck()``.
        poke: wakes the writer (it then writes a heartbeat if ``silent``).
        on_stuck: called once, from the timer; the timer stops then.
        clock: the clock; the running asyncio loop when ``None``.

    Attributes:
        last_write: ``clock.time()`` when the last write ended (or the watch
            started).
        write_started: ``clock.time()`` when the write in flight started;
            ``None`` when none is.
    """

    __slots__ = (
        "_heartbeat_s",
        "_on_stuck",
        "_poke",
        "_stuck_s",
        "_timer",
        "clock",
        "last_write",
        "write_started",
    )

    def __init__(
        self,
        heartbeat_interval_s: float,
        stuck_timeout_s: float,
        poke: Callable[[], None],
        on_stuck: Callable[[], None],
        clock: Timers | None = None,
    ) -> None:
        self.clock: Timers = clock if clock is not None else asyncio.get_running_loop()
        self._heartbeat_s = heartbeat_interval_s
        self._stuck_s = stuck_timeout_s
        self._poke = poke
        self._on_stuck = on_stuck
        self.last_write = self.clock.time()
        self.write_started: float | None = None
        self._timer = self.clock.call_at(self._due(self.last_write), self._check)

    @property
    def silent(self) -> bool:
        """Whether nothing was written for ``heartbeat_interval_s``."""
        since = self.clock.time() - self.last_write
        return since >= self._heartbeat_s - CLOCK_SLACK_S

    def writing(self) -> None:
        """A write starts now."""
        self.write_started = self.clock.time()

    def wrote(self) -> None:
        """The write ended: the client accepted the bytes."""
        self.last_write = self.clock.time()
        self.write_started = None

    def cancel(self) -> None:
        """Stop the timer (the stream ended)."""
        self._timer.cancel()

    def _due(self, now: float) -> float:
        if self.write_started is not None:
            due = self.write_started + self._stuck_s
        else:
            due = min(self.last_write + self._heartbeat_s, now + self._stuck_s / 4)
        return max(due, now + CLOCK_SLACK_S)  # never in the past: no spinning

    def _check(self) -> None:
        now = self.clock.time()
        started = self.write_started
        if started is not None and now - started >= self._stuck_s:
            self._on_stuck()
            return
        if (
            started is None
            and now - self.last_write >= self._heartbeat_s - CLOCK_SLACK_S
        ):
            self._poke()
            # The heartbeat's own write may get stuck: check it in time.
            due = now + min(self._heartbeat_s, self._stuck_s / 4)
        else:
            due = self._due(now)
        self._timer = self.clock.call_at(due, self._check)
