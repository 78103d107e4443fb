"""HeapClock: callbacks due at loop times, for many sequences, on one loop timer.

Entries ``(due, order, wake, entry, callback)`` in two places: a lane (a deque
in due order) that takes every entry due no earlier than its last one, and a
heap for the others; the loop timer is armed for the earliest entry only, and
entries run in ``(due, order)`` order across both. Sequences that step at one
rate are added in due order (each one step after its last), so in a steady
state every entry goes through the lane: an append and a pop from its left
per step, where a heap of thousands of entries costs a push and a pop of
about a dozen tuple comparisons each; a prefill delay or a stall (an entry
earlier than the lane's last) goes to the heap. An entry whose ``wake`` no
longer matches its owner's was voided (abort) and is skipped. Entries due
within half a millisecond of now run together: the loop's own timers are no
finer (uvloop rounds to whole milliseconds). An entry added while the clock
fires waits for the next loop iteration, so a zero delay still yields to the
loop.

Why one heap and not a timer per sequence: with thousands of streams, a loop
timer per step cost more than the step itself (see ``engines/scripted/engine.py``).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
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

_Entry = tuple[float, int, int, _W, Callable[[_W], None]]
"""``(due, order, wake, owner, callback)``: ``wake`` is the owner's when added."""


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
        self._heap: list[_Entry[_W]] = []
        self._lane: deque[_Entry[_W]] = deque()  # in (due, order) order
        self._order = itertools.count()
        self._timer: Timer | None = None
        self._timer_due = math.inf
        self._firing = False
        self._voided = 0  # voided entries still in the heap or the lane

    def __len__(self) -> int:
        """Entries held, voided ones not yet dropped included."""
        return len(self._heap) + len(self._lane)

    def at(self, due: float, owner: _W, callback: Callable[[_W], None]) -> None:
        """Call ``callback(owner)`` at time ``due`` (seconds), unless voided.

        An owner has one entry at most: ``at`` again only once it ran.
        """
        assert not owner.pending, "one clock entry per sequence"
        owner.pending = True
        entry = (due, next(self._order), owner.wake, owner, callback)
        lane = self._lane
        if not lane or due >= lane[-1][0]:
            lane.append(entry)
        else:
            heapq.heappush(self._heap, entry)
        if due < self._timer_due and not self._firing:
            self._arm(due)

    def void(self, owner: _W) -> None:
        """Drop ``owner``'s entry: it will not run. When voided entries are most of
        the entries (many aborts during long prefill delays), the heap and the
        lane are rebuilt without them, so that they hold no aborted request for
        long."""
        owner.wake += 1
        owner.pending = False
        self._voided += 1
        if not self._firing:
            self._compact()

    def _compact(self) -> None:
        if self._voided > 64 and 2 * self._voided > len(self):
            self._heap = [e for e in self._heap if e[2] == e[3].wake]
            heapq.heapify(self._heap)
            self._lane = deque(e for e in self._lane if e[2] == e[3].wake)
            self._voided = 0

    def _arm(self, due: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_due = due
        self._timer = self.timers.call_at(due, self._fire)

    def _fire(self) -> None:
        self._timer, self._timer_due = None, math.inf
        heap, lane = self._heap, self._lane
        horizon = self.timers.time() + self._SLACK_S
        added = next(self._order)  # entries from this order on are added now
        self._firing = True
        try:
            while True:
                if lane:
                    entry = lane[0]
                    if heap and heap[0] < entry:
                        entry = heap[0]
                        if entry[0] > horizon or entry[1] >= added:
                            break
                        heapq.heappop(heap)
                    else:
                        if entry[0] > horizon or entry[1] >= added:
                            break
                        lane.popleft()
                elif heap:
                    entry = heap[0]
                    if entry[0] > horizon or entry[1] >= added:
                        break
                    heapq.heappop(heap)
                else:
                    break
                _, _, wake, owner, callback = entry
                if wake != owner.wake:
                    self._voided -= 1
                    continue
                owner.pending = False
                callback(owner)  # may add entries, due now or later
        finally:
            self._firing = False
            self._compact()
            first = self._first_due()
            if first < math.inf:
                self._arm(first)

    def _first_due(self) -> float:
        heap, lane = self._heap, self._lane
        if heap and lane:
            return min(heap[0][0], lane[0][0])
        if heap:
            return heap[0][0]
        return lane[0][0] if lane else math.inf
