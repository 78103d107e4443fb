"""The values the upstream pool takes and gives: members, outcomes, refusals, counters.

``PoolMember`` names one upstream and its cap; a leased stream ends with an
``Outcome`` (for the member's health); a request the pool cannot place gets a
``PoolRefusal`` (a ``RefusalReason`` and a wait in seconds); ``UpstreamCounters``
is one member's state for metrics. ``pool.UpstreamPool`` does the bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = [
    "Outcome",
    "PoolMember",
    "PoolRefusal",
    "RefusalReason",
    "UpstreamCounters",
]


class Outcome(StrEnum):
    """How a leased stream went, for the member's health."""

    SUCCESS = "success"
    """The upstream served it (to its end, or until the client left)."""
    FAILURE = "failure"
    """Connect error, 5xx, reset, a time limit: counts towards ejection."""
    REFUSED = "refused"
    """The upstream answered sanely but said no (429, a 4xx): no ejection."""


class RefusalReason(StrEnum):
    """Why the pool refused a request."""

    NONE_ELIGIBLE = "none_eligible"
    """No member is healthy, or the request tried every healthy one."""
    QUEUE_FULL = "queue_full"
    """Every eligible member is at its cap and the queue is full."""
    QUEUE_TIMEOUT = "queue_timeout"
    """The request waited ``queue_timeout_s`` without a free member."""


@dataclass(frozen=True, slots=True)
class PoolMember:
    """One upstream of a pool: its name (the base URL will do) and its cap."""

    name: str
    max_streams: int = 64


@dataclass(frozen=True, slots=True)
class PoolRefusal:
    """The pool's no: why, and how long a client should wait (seconds)."""

    reason: RefusalReason
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class UpstreamCounters:
    """One member's state and counters, for metrics.

    Units: streams for ``in_flight``/``max_streams``/``*_total``; seconds for
    ``ttft_s_sum`` (over ``ttft_count`` streams that got a first token).
    ``usage_rejected_total`` (streams whose usage could not be true) is the
    engine's to fill; the pool leaves it 0.
    """

    name: str
    healthy: bool
    ejected: bool
    in_flight: int
    max_streams: int
    streams_total: int
    failures_total: int
    refusals_total: int
    ejections_total: int
    ttft_s_sum: float
    ttft_count: int
    usage_rejected_total: int = 0
