"""HeapClock: callbacks due at loop times, for many sequences, on one loop timer.

A heap of ``(due, order, wake, entry, callback)``; the loop timer is armed for
the earliest entry only. An entry whose ``wake`` no longer matches its owner's
was voided (abort) and is skipped. Entries due within half a millisecond of now
run together: the loop's own timers are no finer (uvloop rounds to whole
milliseconds). An entry added while the clock fires waits for the next loop
iteration, so a zero delay still yields to the loop.

Why one heap and not a timer per sequence: with thousands of streams, a loop
timer per step cost more than the step itself (see ``engines/scripted/engine.py``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from sluicegate.engines.clocks import Timer, Timers

__all__ = ["HeapClock", "Waker"]


class Waker(Protocol):
    """What owns a clock entry: the clock reads and bumps these two fields."""

    wake: int
    """Bumped to void the owner's entry in the clock."""
    pending: bool
    """Whether the owner has a live entry in the clock."""


_W = TypeVar("_W", bound=Waker)


class HeapClock(Generic[_W]):
    """Callbacks due at loop times, for many owners, on one loop timer.

    Args:
        timers: what drives this clock: the event loop (asked once, not per
            token: ``get_running_loop()`` is a ``getpid`` system call in CPython
            3.11), or a ``ManualClock``.
    """

    _SLACK_S = 0.0005

    def __init__(self, timers: Timers) -> None:
        self.timers = timers
        """What drives this clock (see ``Args``)."""
        self._heap: list[tuple[float, int, int, _W, Callable[[_W], None]]] = []
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._timer_due = math.inf
        self._firing = False
        self._voided = 0  # voided entries still in the heap

    def at(self, due: float, owner: _W, callback: Callable[[_W], None]) -> None:
        """Call ``callback(owner)`` at time ``due`` (seconds), unless voided.

        An owner has one entry at most: ``at`` again only once it ran.
        """
        assert not owner.pending, "one clock entry per sequence"
        owner.pending = True
        heapq.heappush(
            self._heap, (due, next(self._order), owner.wake, owner, callback)
        )
        if due < self._timer_due and not self._firing:
            self._arm(due)

    def void(self, owner: _W) -> None:
        """Drop ``owner``'s entry: it will not run. When voided entries are most of
        the heap (many aborts during long prefill delays), the heap is rebuilt
        without them, so that it holds no aborted request for long."""
        owner.wake += 1
        owner.pending = False
        self._voided += 1
        if not self._firing:
            self._compact()

    def _compact(self) -> None:
        if self._voided > 64 and 2 * self._voided > len(self._heap):
            self._heap = [e for e in self._heap if e[2] == e[3].wake]
            heapq.heapify(self._heap)
            self._voided = 0

    def _arm(self, due: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.timers.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_due = None, math.inf
        heap = self._heap
        horizon = self.timers.time() + self._SLACK_S
        added = next(self._order)  # entries from this order on are added now
        self._firing = True
        try:
            while heap and heap[0][0] <= horizon and heap[0][1] < added:
                _, _, wake, owner, callback = heapq.heappop(heap)
                if wake != owner.wake:
                    self._voided -= 1
                    continue
                owner.pending = False
                callback(owner)  # may add entries, due now or later
        finally:
            self._firing = False
            self._compact()
            if self._heap:
                self._arm(self._heap[0][0])
