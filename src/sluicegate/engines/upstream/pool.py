"""The upstreams of one model: which one takes the next stream, and which are out.

``UpstreamPool`` is bookkeeping with a clock and no I/O: the upstream engine
asks it for a ``Lease`` on a member, opens the stream itself, and tells it how
the stream went. It keeps:

- routing: the eligible member with the fewest streams in flight (ties: the one
  chosen least recently);
- a cap of streams per member; past every cap a request waits in one bounded
  FIFO queue for at most ``queue_timeout_s``, then is refused (503 with
  ``Retry-After``); a full queue refuses at once;
- passive ejection: ``eject_after_failures`` failures in a row (connect error,
  5xx, reset, a time limit) take a member out for ``cooldown_s``; it is
  eligible again after that, with its count of failures cleared;
- active health: ``report_health(name, ok)`` from the engine's own checks
  (``GET /models``); a member whose last check failed takes no new stream;
- counters per member for metrics (``UpstreamCounters``).

A member is *eligible* for a request when it is healthy (its last check did not
fail and it is not ejected) and the request has not tried it already (failover
passes the members it tried as ``exclude``).

Invariants:
    - ``in_flight`` of a member never exceeds its ``max_streams``.
    - Each request gets exactly one answer: its ``grant`` or its ``refuse``
      callback, once, unless its ``Ticket`` was cancelled first; a request that
      no eligible member could ever take (all ejected, unhealthy or excluded)
      is refused at once, also while it waits.
    - Each lease is released once; a second ``release`` is a no-op.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Sequence

from sluicegate.engines.clocks import Timer, Timers
from sluicegate.engines.pool_values import (
    Outcome,
    PoolMember,
    PoolRefusal,
    RefusalReason,
    UpstreamCounters,
)

# Outcome, PoolMember, PoolRefusal, RefusalReason and UpstreamCounters are
# pool_values.py's; they stay exported here while engines/upstream/engine.py imports
# them from this module.
__all__ = [
    "Lease",
    "Outcome",
    "PoolMember",
    "PoolRefusal",
    "RefusalReason",
    "Ticket",
    "UpstreamCounters",
    "UpstreamPool",
]


class _Member:
    __slots__ = (
        "chosen_at",
        "down",
        "ejected_until",
        "ejections",
        "failures",
        "failures_in_row",
        "in_flight",
        "max_streams",
        "name",
        "refusals",
        "streams",
        "ttft_count",
        "ttft_sum",
    )

    def __init__(self, spec: PoolMember) -> None:
        self.name = spec.name
        self.max_streams = spec.max_streams
        self.in_flight = 0
        self.down = False  # the last active check failed
        self.ejected_until = -math.inf
        self.failures_in_row = 0
        self.chosen_at = -1
        self.streams = self.failures = self.refusals = self.ejections = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0


class Lease:
    """One stream on one member; ``release`` it once, with its outcome."""

    __slots__ = ("_pool", "_released", "member", "started")

    def __init__(self, pool: UpstreamPool, member: int, started: float) -> None:
        self._pool = pool
        self.member = member
        """The member's index in the pool."""
        self.started = started
        self._released = False

    @property
    def name(self) -> str:
        """The member's name."""
        return self._pool.members[self.member].name

    def first_token(self) -> None:
        """The stream's first content arrived now (its time to first token)."""
        self._pool._first_token(self)

    def release(self, outcome: Outcome) -> None:
        """The stream ended; ``outcome`` says how, for the member's health."""
        if not self._released:
            self._released = True
            self._pool._release(self, outcome)


class Ticket:
    """A request's place in the pool: ``cancel()`` it to leave the queue."""

    __slots__ = ("_pool", "done", "exclude", "grant", "refuse", "timer")

    def __init__(
        self,
        pool: UpstreamPool,
        grant: Callable[[Lease], None],
        refuse: Callable[[PoolRefusal], None],
        exclude: frozenset[int],
    ) -> None:
        self._pool = pool
        self.grant = grant
        self.refuse = refuse
        self.exclude = exclude
        self.done = False
        self.timer: Timer | None = None

    def cancel(self) -> None:
        """Give up: no callback follows (a lease already granted stays the
        caller's to release)."""
        if not self.done:
            self._pool._leave(self)


class UpstreamPool:
    """The members serving one model, and the queue of requests waiting for one.

    Args:
        members: the upstreams, in order (``Lease.member`` indexes them).
        timers: the clock (the event loop; ``ManualClock`` in tests).
        max_queued: requests that may wait for a free member (0: none).
        queue_timeout_s: the longest wait in the queue (seconds).
        eject_after_failures: failures in a row that eject a member (>= 1).
        cooldown_s: how long an ejected member stays out (seconds).
        retry_after_s: the ``Retry-After`` of a refusal while some member is
            eligible (seconds); with none eligible, the time until the first
            ejection ends, at least this.

    Raises:
        ValueError: no members, a cap below 1, or a negative limit.
    """

    def __init__(
        self,
        members: Sequence[PoolMember],
        timers: Timers,
        *,
        max_queued: int = 256,
        queue_timeout_s: float = 30.0,
        eject_after_failures: int = 3,
        cooldown_s: float = 10.0,
        retry_after_s: float = 1.0,
    ) -> None:
        if not members:
            raise ValueError("expected at least one upstream in a pool, got none")
        for spec in members:
            if spec.max_streams < 1:
                raise ValueError(
                    f"expected max_streams >= 1 for {spec.name!r}, got "
                    f"{spec.max_streams}"
                )
        if max_queued < 0 or queue_timeout_s < 0 or eject_after_failures < 1:
            raise ValueError(
                "expected max_queued >= 0, queue_timeout_s >= 0 and "
                f"eject_after_failures >= 1, got {max_queued}, {queue_timeout_s}, "
                f"{eject_after_failures}"
            )
        self._timers = timers
        self._members = [_Member(spec) for spec in members]
        self._queue: deque[Ticket] = deque()
        self._max_queued = max_queued
        self._queue_timeout_s = queue_timeout_s
        self._eject_after = eject_after_failures
        self._cooldown_s = cooldown_s
        self._retry_after_s = retry_after_s
        self._choices = 0

    @property
    def members(self) -> Sequence[PoolMember]:
        """The members, in order."""
        return [PoolMember(m.name, m.max_streams) for m in self._members]

    @property
    def queued(self) -> int:
        """Requests waiting for a free member."""
        return len(self._queue)

    @property
    def in_flight(self) -> int:
        """Streams leased on all members."""
        return sum(m.in_flight for m in self._members)

    def healthy(self, member: int) -> bool:
        """Whether ``member`` takes new streams (checked healthy, not ejected)."""
        m = self._members[member]
        return not m.down and m.ejected_until <= self._timers.time()

    def request(
        self,
        grant: Callable[[Lease], None],
        refuse: Callable[[PoolRefusal], None],
        exclude: Collection[int] = (),
    ) -> Ticket:
        """Ask for a stream on an eligible member other than ``exclude``.

        ``grant(lease)`` is called at once when a member has room, else when one
        frees up; ``refuse(refusal)`` at once when no member is eligible or the
        queue is full, else when the wait exceeds ``queue_timeout_s`` or the
        last eligible member drops out. Both run synchronously, inside this
        call or inside the clock's or another pool call's.

        Returns:
            The request's ``Ticket`` (already ``done`` when answered at once).
        """
        ticket = Ticket(self, grant, refuse, frozenset(exclude))
        if not self._try_grant(ticket):
            if not self._any_eligible(ticket):
                self._refuse(ticket, RefusalReason.NONE_ELIGIBLE)
            elif len(self._queue) >= self._max_queued:
                self._refuse(ticket, RefusalReason.QUEUE_FULL)
            else:
                self._queue.append(ticket)
                deadline = self._timers.time() + self._queue_timeout_s
                ticket.timer = self._timers.call_at(
                    deadline, lambda: self._time_out(ticket)
                )
        return ticket

    def report_health(self, member: int, ok: bool) -> None:
        """The result of an active health check of ``member``."""
        self._members[member].down = not ok
        self._pump()

    def counters(self) -> list[UpstreamCounters]:
        """Each member's state and counters, in order."""
        now = self._timers.time()
        return [
            UpstreamCounters(
                name=m.name,
                healthy=not m.down and m.ejected_until <= now,
                ejected=m.ejected_until > now,
                in_flight=m.in_flight,
                max_streams=m.max_streams,
                streams_total=m.streams,
                failures_total=m.failures,
                refusals_total=m.refusals,
                ejections_total=m.ejections,
                ttft_s_sum=m.ttft_sum,
                ttft_count=m.ttft_count,
            )
            for m in self._members
        ]

    # -- internals -----------------------------------------------------------

    def _eligible(self, member: int, ticket: Ticket, now: float) -> bool:
        m = self._members[member]
        return member not in ticket.exclude and not m.down and m.ejected_until <= now

    def _any_eligible(self, ticket: Ticket) -> bool:
        now = self._timers.time()
        return any(self._eligible(i, ticket, now) for i in range(len(self._members)))

    def _try_grant(self, ticket: Ticket) -> bool:
        now = self._timers.time()
        best: int | None = None
        for i, m in enumerate(self._members):
            if m.in_flight >= m.max_streams or not self._eligible(i, ticket, now):
                continue
            b = None if best is None else self._members[best]
            if b is None or (m.in_flight, m.chosen_at) < (b.in_flight, b.chosen_at):
                best = i
        if best is None:
            return False
        m = self._members[best]
        m.in_flight += 1
        m.streams += 1
        self._choices += 1
        m.chosen_at = self._choices
        self._finish(ticket)
        ticket.grant(Lease(self, best, now))
        return True

    def _finish(self, ticket: Ticket) -> None:
        ticket.done = True
        if ticket.timer is not None:
            ticket.timer.cancel()
            ticket.timer = None

    def _refuse(self, ticket: Ticket, reason: RefusalReason) -> None:
        self._finish(ticket)
        ticket.refuse(PoolRefusal(reason, self._retry_after(ticket)))

    def _retry_after(self, ticket: Ticket) -> float:
        if self._any_eligible(ticket):
            return self._retry_after_s
        now = self._timers.time()
        ends = [
            m.ejected_until
            for i, m in enumerate(self._members)
            if i not in ticket.exclude and not m.down and m.ejected_until > now
        ]
        return (
            max(self._retry_after_s, min(ends) - now) if ends else self._retry_after_s
        )

    def _time_out(self, ticket: Ticket) -> None:
        ticket.timer = None
        if not ticket.done:
            self._queue.remove(ticket)
            self._refuse(ticket, RefusalReason.QUEUE_TIMEOUT)

    def _leave(self, ticket: Ticket) -> None:
        self._queue.remove(ticket)
        self._finish(ticket)

    def _first_token(self, lease: Lease) -> None:
        m = self._members[lease.member]
        m.ttft_sum += self._timers.time() - lease.started
        m.ttft_count += 1

    def _release(self, lease: Lease, outcome: Outcome) -> None:
        m = self._members[lease.member]
        m.in_flight -= 1
        if outcome is Outcome.SUCCESS:
            m.failures_in_row = 0
        elif outcome is Outcome.REFUSED:
            m.refusals += 1
        else:
            m.failures += 1
            m.failures_in_row += 1
            if m.failures_in_row >= self._eject_after:
                m.failures_in_row = 0
                m.ejections += 1
                m.ejected_until = self._timers.time() + self._cooldown_s
        self._pump()

    def _pump(self) -> None:
        """Grant what can be granted, in queue order; refuse what never can."""
        for ticket in list(self._queue):
            if ticket.done:  # answered by a callback of an earlier one
                continue
            if self._try_grant(ticket):
                self._queue.remove(ticket)
            elif not self._any_eligible(ticket):
                self._queue.remove(ticket)
                self._refuse(ticket, RefusalReason.NONE_ELIGIBLE)
