"""When to restart a child process (back-off, a limit), and when to kill a stuck one.

A supervisor (``serve --workers``'s front-end workers, the engine process)
reports each unexpected exit with the time it happened and how long the child
had run; ``RestartBudget`` answers how many seconds to wait before the next
start, or ``None`` once the limit is reached (the supervisor then gives up,
says so, and exits). ``StuckWatch`` reads the beats of a child that is alive
but may not be working (the engine process: stopped, or in a step that never
returns) and says when it is to be killed, which turns it into an exit.
Pure: the caller owns the clock.

Invariants:
    - The delay doubles from ``base_s`` with each exit that follows a short
      life (under ``healthy_s``), up to ``max_s``; an exit after a healthy run
      starts again from ``base_s``.
    - At most ``limit`` restarts within any ``window_s`` seconds; the exit
      past it gets ``None``, and so does every later one.

Spec: the exponential back-off of systemd's ``RestartSec``/``StartLimitBurst``
and Kubernetes' ``CrashLoopBackOff``, in miniature; ``StuckWatch`` is
systemd's ``WatchdogSec`` (no beat in time: killed) plus a progress deadline.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["Beat", "RestartBudget", "StuckWatch"]


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


@dataclass(frozen=True, slots=True)
class Beat:
    """What a watched child last wrote about itself.

    Attributes:
        tick: a count it moves on at every beat (a live event loop).
        progress: a count that moves whenever its engine does work (steps,
            tokens read or generated, requests ended).
        busy: whether its engine has requests queued or running.
    """

    tick: int
    progress: int
    busy: bool


@dataclass(slots=True)
class StuckWatch:
    """Whether a child that beats is stuck.

    Unarmed until the first beat (the child is still starting: loading a
    model takes its time). Then it is stuck when no new beat has come for
    ``heartbeat_s`` seconds (stopped, or its loop blocked), or when it has
    been busy for ``step_deadline_s`` seconds without progress (a step that
    never returns); an idle child needs no progress.

    Attributes:
        heartbeat_s: the longest time between two beats, in seconds.
        step_deadline_s: the longest time busy without progress, in seconds.
    """

    heartbeat_s: float = 10.0
    step_deadline_s: float = 60.0
    _last: Beat | None = field(default=None, init=False)
    _beat_at_s: float = field(default=0.0, init=False)
    _progress_at_s: float = field(default=0.0, init=False)

    def feed(self, now_s: float, beat: Beat | None) -> str | None:
        """Take the child's beat as read at ``now_s``; say whether it is stuck.

        Args:
            now_s: the time of the read, on any monotonic clock (seconds).
            beat: what the child last wrote, or ``None``: nothing readable.

        Returns:
            ``None`` while the child is live (or not yet armed), else why it
            is stuck, in words.
        """
        last = self._last
        if beat is not None and beat != last:
            if last is None or beat.tick != last.tick:
                self._beat_at_s = now_s
            if last is None or beat.progress != last.progress or not beat.busy:
                self._progress_at_s = now_s
            self._last = last = beat
        if last is None:
            return None
        quiet_s = now_s - self._beat_at_s
        if quiet_s >= self.heartbeat_s:
            return f"no heartbeat for {quiet_s:.1f} s (limit {self.heartbeat_s:g} s)"
        idle_s = now_s - self._progress_at_s
        if last.busy and idle_s >= self.step_deadline_s:
            return (
                f"busy without progress for {idle_s:.1f} s "
                f"(limit {self.step_deadline_s:g} s)"
            )
        return None
