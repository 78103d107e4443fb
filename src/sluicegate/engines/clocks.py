"""Injectable time: the ``Timers`` protocol, ``ManualClock`` and ``Deadline``.

``Deadline`` is the one time limit type of the server's timers.
``ThreadTimers`` is the clock of code that runs in a thread of its own (the
ledger's writer thread), where no event loop is.

An asyncio event loop is ``Timers`` (``time()``, ``call_at()``). A
``ManualClock`` is too, but its time moves only when a test says so: timing
tests then step time instead of sleeping, and what they see does not depend on
how busy the machine is. The model-free engines, the upstream engine (its
pool and its health checks) and the server's timers (a stream's write watch, a
resumable stream's grace, the ledger's progress writes, the loop-lag sampler, a
connection's read deadlines, the waits of a cancel, a count and a shutdown, a
gateway response's patience for its first content, the Redis cancel listener's
retries) take one.

Deliberate divergence: ``Deadline``'s ``async with`` is ``asyncio.timeout`` on
a ``Timers`` clock rather than the running loop's, so that a test can make it
pass by stepping a ``ManualClock``.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Protocol

__all__ = ["Deadline", "ManualClock", "ThreadTimers", "Timer", "Timers"]


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


class ThreadTimers:
    """``Timers`` for code in threads: the monotonic clock, and each callback
    in a ``threading.Timer`` of its own (called in that thread)."""

    def time(self) -> float:
        """Now: ``time.monotonic()`` (seconds)."""
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback()`` once, ``when`` (seconds on ``time()``) or at
        once if that has passed."""
        timer = threading.Timer(max(when - time.monotonic(), 0.0), callback)
        timer.daemon = True
        timer.start()
        return timer


class Deadline:
    """A time limit on a ``Timers`` clock: ``after_s`` seconds from when it is made.

    ``call(callback)`` runs ``callback`` once when it passes; ``async with
    deadline:`` cancels its body then and raises ``TimeoutError`` in its place
    (``asyncio.timeout``'s semantics: a cancellation from elsewhere is not
    turned into a ``TimeoutError``); ``await deadline.passed()`` is a sleep
    until it passes. A deadline already passed fires at the clock's next step.

    Args:
        timers: the clock (the running loop, or a ``ManualClock`` in tests).
        after_s: seconds from now (may be <= 0: passed already).

    Attributes:
        when: the clock's time at which it passes (seconds).
    """

    __slots__ = ("_cancelling", "_fired", "_task", "_timer", "timers", "when")

    def __init__(self, timers: Timers, after_s: float) -> None:
        self.timers = timers
        self.when = timers.time() + after_s
        self._timer: Timer | None = None
        self._task: asyncio.Task[object] | None = None
        self._fired = False
        self._cancelling = 0

    @property
    def expired(self) -> bool:
        """Whether the clock's time has reached ``when``."""
        return self.timers.time() >= self.when

    @property
    def remaining_s(self) -> float:
        """Seconds until ``when`` (0 once passed)."""
        return max(self.when - self.timers.time(), 0.0)

    def call(self, callback: Callable[[], object]) -> None:
        """Run ``callback()`` once when the deadline passes, unless ``cancel()``
        comes first (one callback per deadline; a second replaces the first)."""
        self.cancel()
        self._timer = self.timers.call_at(self.when, callback)

    def cancel(self) -> None:
        """Forget the callback (a no-op once it ran, or without one)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def passed(self) -> None:
        """Return once the deadline has passed (at the clock's next step when
        it already has); cancelling the wait forgets its callback."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        self.call(wake)
        try:
            await waiter
        finally:
            self.cancel()

    async def __aenter__(self) -> Deadline:
        task = asyncio.current_task()
        assert task is not None, "a Deadline is entered by a task"
        self._task = task
        self._cancelling = task.cancelling()
        self.call(self._expire)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cancel()
        task, self._task = self._task, None
        if (
            self._fired
            and task is not None
            and task.uncancel() <= self._cancelling  # always, once it fired
            and exc_type is asyncio.CancelledError
        ):
            raise TimeoutError(f"the deadline of {self.when:g} s passed") from exc

    def _expire(self) -> None:
        task = self._task
        if task is not None and not task.done():
            self._fired = True
            task.cancel()


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
