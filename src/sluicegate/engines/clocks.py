"""Injectable time: a ``Timers`` protocol (an event loop is one) and a ``ManualClock``.

An asyncio event loop is ``Timers`` (``time()``, ``call_at()``). A
``ManualClock`` is too, but its time moves only when a test says so: timing
tests then step time instead of sleeping, and what they see does not depend on
how busy the machine is. The model-free engines, the upstream pool and the
server's timers (a stream's write watch, a resumable stream's grace, the
ledger's progress writes) take one.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Protocol

__all__ = ["ManualClock", "Timer", "Timers"]


class Timer(Protocol):
    """A pending callback (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None:
        """Do not call it; a no-op once it ran."""
        ...


class Timers(Protocol):
    """A clock that calls back at given times (an asyncio event loop is one)."""

    def time(self) -> float:
        """Now, in seconds (any origin; it never goes back)."""
        ...

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback()`` once, when ``time()`` reaches ``when`` (seconds)."""
        ...


class ManualClock:
    """``Timers`` whose time moves only when told to.

    Callbacks run only inside ``step()`` or ``advance()``. A callback that falls
    due while others run waits for the next ``step()``, as on an event loop,
    where a timer due now runs at the next iteration.

    Args:
        start: the time at first (seconds).
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()

    def time(self) -> float:
        """Now (seconds)."""
        return self._now

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback()`` at the first ``step()`` at or after ``when``."""
        timer = _ManualTimer(callback)
        heapq.heappush(self._heap, (when, next(self._order), timer))
        return timer

    @property
    def next_due(self) -> float:
        """When the earliest pending callback is due (``math.inf``: none)."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def step(self) -> int:
        """Run the callbacks due now, as one loop iteration.

        Returns:
            How many ran (the cancelled ones are skipped).
        """
        due = []
        while self._heap and self._heap[0][0] <= self._now:
            due.append(heapq.heappop(self._heap)[2])
        ran = 0
        for timer in due:
            if not timer.cancelled:
                timer.cancelled = True
                timer.callback()
                ran += 1
        return ran

    def jump(self, seconds: float) -> None:
        """Move time on by ``seconds`` (>= 0) and run nothing: a loop that was
        busy; what fell due runs at the next ``step()``."""
        self._now += seconds

    def advance(self, seconds: float, *, max_steps: int = 100_000) -> None:
        """Move time on by ``seconds`` (>= 0), stepping at each due time on the
        way, and at the end.

        Raises:
            RuntimeError: more than ``max_steps`` steps (callbacks that keep
                falling due without time moving, such as an unbounded rate).
        """
        end = self._now + seconds
        for _ in range(max_steps):
            due = self.next_due
            if due > end:
                self._now = end
                return
            self._now = max(self._now, due)
            self.step()
        raise RuntimeError(f"expected at most {max_steps} steps; time does not move")


class _ManualTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
