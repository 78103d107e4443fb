"""Per-key quotas as token buckets, and the grant an admitted request holds.

A ``TokenBucket`` holds ``capacity`` units and refills continuously at
``capacity`` per minute; a ``Quota`` names a key's two capacities (requests and
tokens per minute); a ``Grant`` is one admitted request's reservation, given back
once: in part (``release``, the unused tokens) or whole (``refund``, when the
engine refused it). ``SharedQuotas`` is the protocol of buckets kept outside
this process (``redis_quotas.RedisQuotas``), shared by several replicas.
``admission.Admission`` decides with them.

Spec: docs/DESIGN.md, "Admission and limits".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Grant", "Quota", "SharedBucket", "SharedQuotas", "TokenBucket"]


class TokenBucket:
    """A bucket of ``capacity`` units refilled at ``capacity`` per 60 seconds.

    Args:
        capacity: units per minute (> 0); the bucket starts full.
        now: the clock time (seconds) it starts at.
    """

    def __init__(self, capacity: float, now: float) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be > 0, got {capacity!r}")
        self.capacity = capacity
        self._rate_per_s = capacity / 60.0
        self._level = capacity
        self._at = now

    def level(self, now: float) -> float:
        """Units available at ``now`` (refilled since the last call)."""
        self._level = min(
            self.capacity, self._level + (now - self._at) * self._rate_per_s
        )
        self._at = max(self._at, now)
        return self._level

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are available (0 when they are now)."""
        missing = amount - self.level(now)
        return max(missing, 0.0) / self._rate_per_s

    def take(self, amount: float) -> None:
        """Remove ``amount`` units (call ``wait_s`` first; may go negative)."""
        self._level -= amount

    def give(self, amount: float) -> None:
        """Return ``amount`` units, never above ``capacity``."""
        self._level = min(self.capacity, self._level + amount)


@dataclass(frozen=True, slots=True)
class Quota:
    """Per-key limits; ``None`` disables a limit.

    Attributes:
        requests_per_minute: requests started per minute.
        tokens_per_minute: prompt + ``max_tokens`` reserved per minute (tokens).
    """

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None


class SharedQuotas(Protocol):
    """Token buckets kept outside this process, shared by several replicas."""

    async def take(
        self, key_id: str, tokens: int, dry_run: bool
    ) -> tuple[float, float]:
        """Take one request and ``tokens`` from both buckets or neither; return
        ``(request_wait_s, token_wait_s)`` (both 0: taken, unless ``dry_run``).

        Raises:
            Unavailable: the store cannot be reached (503).
        """
        ...

    def give(self, key_id: str, requests: int, tokens: int) -> None:
        """Give back ``requests`` and ``tokens`` (without waiting for the store)."""
        ...


class _Refillable(Protocol):
    def give(self, amount: float) -> None: ...


@dataclass(frozen=True, slots=True)
class SharedBucket:
    """One of a key's shared buckets, as a ``Grant`` gives back to it."""

    shared: SharedQuotas
    key_id: str
    requests: bool

    def give(self, amount: float) -> None:
        if self.requests:
            self.shared.give(self.key_id, int(amount), 0)
        else:
            self.shared.give(self.key_id, 0, int(amount))


class Grant:
    """An admitted request's reservation; ``release`` returns the unused tokens.

    ``release`` and ``refund`` act once between them; later calls do nothing.
    """

    def __init__(
        self,
        key_id: str,
        reserved: int,
        bucket: _Refillable | None,
        requests: _Refillable | None = None,
    ):
        self.key_id = key_id
        self.reserved_tokens = reserved
        self._bucket = bucket
        self._requests = requests
        self._settled = False

    def release(self, used_tokens: int) -> None:
        """Give back ``reserved - used_tokens`` tokens (the request stays spent)."""
        if not self._settled:
            self._settled = True
            if self._bucket is not None:
                self._bucket.give(max(self.reserved_tokens - used_tokens, 0))

    def refund(self) -> None:
        """Give back the request and every reserved token: the engine refused it
        before it ran (a full queue)."""
        if not self._settled:
            self._settled = True
            if self._bucket is not None:
                self._bucket.give(self.reserved_tokens)
            if self._requests is not None:
                self._requests.give(1)
