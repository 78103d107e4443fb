"""When to restart a child process that exited: back-off, and a limit.

A supervisor (``serve --workers``'s front-end workers, the engine process)
reports each unexpected exit with the time it happened and how long the child
had run; ``RestartBudget`` answers how many seconds to wait before the next
start, or ``None`` once the limit is reached (the supervisor then gives up,
says so, and exits). Pure: the caller owns the clock.

Invariants:
    - The delay doubles from ``base_s`` with each exit that follows a short
      life (under ``healthy_s``), up to ``max_s``; an exit after a healthy run
      starts again from ``base_s``.
    - At most ``limit`` restarts within any ``window_s`` seconds; the exit
      past it gets ``None``, and so does every later one.

Spec: the exponential back-off of systemd's ``RestartSec``/``StartLimitBurst``
and Kubernetes' ``CrashLoopBackOff``, in miniature.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["RestartBudget"]


@dataclass(slots=True)
class RestartBudget:
    """The restart decisions for one child.

    Attributes:
        base_s: seconds before the first restart.
        max_s: the longest wait between restarts, in seconds.
        healthy_s: a child that ran at least this many seconds resets the delay.
        limit: restarts allowed within ``window_s`` seconds.
        window_s: the span, in seconds, that ``limit`` counts over.
        given_up: set once ``after_exit`` answered ``None``.
    """

    base_s: float = 0.1
    max_s: float = 5.0
    healthy_s: float = 30.0
    limit: int = 10
    window_s: float = 60.0
    given_up: bool = False
    _delay_s: float = field(default=0.0, init=False)
    _starts: deque[float] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s or self.limit < 0 or self.window_s <= 0:
            raise ValueError(
                "expected 0 < base_s <= max_s, limit >= 0 and window_s > 0, got "
                f"{self.base_s!r}, {self.max_s!r}, {self.limit!r}, {self.window_s!r}"
            )

    def after_exit(self, now_s: float, ran_s: float) -> float | None:
        """Seconds to wait before restarting a child that exited at ``now_s``
        after running ``ran_s`` seconds, or ``None``: the limit is reached.

        Args:
            now_s: the time of the exit, on any monotonic clock (seconds).
            ran_s: how long the child ran, in seconds (>= 0).

        Returns:
            The delay in seconds (``base_s`` to ``max_s``), or ``None`` after
            ``limit`` restarts within ``window_s`` (and from then on).
        """
        if self.given_up:
            return None
        while self._starts and self._starts[0] <= now_s - self.window_s:
            self._starts.popleft()
        if len(self._starts) >= self.limit:
            self.given_up = True
            return None
        if ran_s >= self.healthy_s or self._delay_s == 0.0:
            self._delay_s = self.base_s
        else:
            self._delay_s = min(self._delay_s * 2, self.max_s)
        self._starts.append(now_s + self._delay_s)
        return self._delay_s
