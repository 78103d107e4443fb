"""RedisQuotas: per-key token buckets kept in Redis, one budget for every replica.

The same buckets as ``quotas.TokenBucket`` (``capacity`` units, refilled at
``capacity`` per 60 s, starting full), but each is a Redis hash
``<prefix>quota:<kind>:<key_id>`` (``kind`` is ``requests`` or ``tokens``) that
every replica pointed at the same Redis reads and takes from, so N replicas
enforce one quota per key, not N.

Invariants:
    - A take is one Lua script (``TAKE``), atomic in Redis: both buckets are
      refilled by the time elapsed on Redis's own clock (``TIME``: the replicas'
      clocks never matter), then the request and its tokens are taken from both
      or from neither; a refusal returns each bucket's wait in seconds.
    - A give-back (``Grant.release``'s unused tokens, ``Grant.refund``'s request
      and tokens) is a second script (``GIVE``), never above the capacity. It
      is sent in the background: ``give`` does not wait for Redis, and a
      give-back that fails is logged and lost (the key gets less back, never
      more than its quota).
    - A bucket's hash expires 61 s after its last write: by then it would be
      full again, and a missing hash reads as full. Redis holds at most two
      small hashes per key that was active in the last minute.
    - Redis unreachable at admission: the request is refused with 503
      (``Unavailable``, code ``quota_store_unavailable``, ``Retry-After``), never
      let through unmetered.

Spec: docs/DESIGN.md, "Admission and limits"; Redis documentation, "Scripting
with Lua" (scripts are atomic; ``TIME`` under effects replication).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from sluicegate.server.admission.quotas import Quota
from sluicegate.server.http.errors import RedisUnavailable, Unavailable
from sluicegate.server.redis.client import redis_errors

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["GIVE", "TAKE", "RedisQuotas"]

logger = logging.getLogger(__name__)

TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local function level(key, cap)
  local v = redis.call('HMGET', key, 'level', 'at')
  local lvl, at = tonumber(v[1]), tonumber(v[2])
  if not lvl then return cap end
  return math.min(cap, lvl + math.max(now - at, 0) * cap / 60)
end
local function wait(lvl, amount, cap)
  if lvl >= amount then return 0 end
  return (amount - lvl) * 60 / cap
end
local function store(key, lvl)
  redis.call('HSET', key, 'level', string.format('%.17g', lvl),
             'at', string.format('%.17g', now))
  redis.call('PEXPIRE', key, 61000)
end
local rcap, tcap, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local rl, tl, rw, tw = 0, 0, 0, 0
if rcap > 0 then rl = level(KEYS[1], rcap); rw = wait(rl, 1, rcap) end
if tcap > 0 then tl = level(KEYS[2], tcap); tw = wait(tl, tokens, tcap) end
if rw > 0 or tw > 0 or ARGV[4] == '0' then
  return {string.format('%.17g', rw), string.format('%.17g', tw)}
end
if rcap > 0 then store(KEYS[1], rl - 1) end
if tcap > 0 then store(KEYS[2], tl - tokens) end
return {'0', '0'}
"""
"""KEYS: requests bucket, tokens bucket. ARGV: requests/min (0: none), tokens/min
(0: none), tokens to reserve, 1 to take or 0 to only check. Returns the two
waits in seconds, as strings (``{'0', '0'}``: admitted)."""

GIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 1, 2 do
  local cap, amount = tonumber(ARGV[i]), tonumber(ARGV[i + 2])
  local v = redis.call('HMGET', KEYS[i], 'level', 'at')
  local lvl, at = tonumber(v[1]), tonumber(v[2])
  if cap > 0 and amount > 0 and lvl then
    lvl = math.min(cap, lvl + math.max(now - at, 0) * cap / 60 + amount)
    redis.call('HSET', KEYS[i], 'level', string.format('%.17g', lvl),
               'at', string.format('%.17g', now))
    redis.call('PEXPIRE', KEYS[i], 61000)
  end
end
return 0
"""
"""KEYS: requests bucket, tokens bucket. ARGV: requests/min, tokens/min (0:
none), requests and tokens to give back. A missing bucket is full already."""


class RedisQuotas:
    """Shared requests/minute and tokens/minute buckets (see the module doc).

    Implements ``quotas.SharedQuotas``.

    Args:
        client: from ``redis_client.connect``.
        quota: the per-key limits (every replica should be given the same).
        retry_after_s: ``Retry-After`` seconds of the 503 when Redis is down.
        prefix: the start of every key this server writes.
    """

    def __init__(
        self,
        client: Redis,
        quota: Quota,
        retry_after_s: int = 1,
        prefix: str = "sluicegate:",
    ) -> None:
        self._client = client
        self._limits = (quota.requests_per_minute or 0, quota.tokens_per_minute or 0)
        self._retry_after_s = retry_after_s
        self._prefix = prefix
        self._take = client.register_script(TAKE)
        self._give = client.register_script(GIVE)
        self._pending: set[asyncio.Task[None]] = set()

    async def take(
        self, key_id: str, tokens: int, dry_run: bool
    ) -> tuple[float, float]:
        """Take one request and ``tokens`` from ``key_id``'s buckets, or neither.

        Args:
            key_id: the key's id (never the key).
            tokens: tokens to reserve (prompt + ``n * max_tokens``).
            dry_run: only compute the waits; take nothing.

        Returns:
            ``(request_wait_s, token_wait_s)``: both 0 when admitted (and, unless
            ``dry_run``, taken); otherwise nothing was taken.

        Raises:
            Unavailable: Redis cannot be reached (503, ``Retry-After``).
        """
        try:
            with redis_errors("taking quota"):
                waits = await self._take(
                    keys=self._keys(key_id),
                    args=[*self._limits, tokens, 0 if dry_run else 1],
                )
        except RedisUnavailable as exc:
            logger.warning("%s: refusing the request with 503", exc)
            raise Unavailable(
                "The shared quota store cannot be reached; retry later",
                "quota_store_unavailable",
                self._retry_after_s,
            ) from exc
        return float(waits[0]), float(waits[1])

    def give(self, key_id: str, requests: int, tokens: int) -> None:
        """Give back ``requests`` and ``tokens`` to ``key_id``'s buckets, in the
        background (never above their capacity; lost if Redis is down)."""
        if requests <= 0 and tokens <= 0:
            return
        task = asyncio.get_running_loop().create_task(
            self._give_back(key_id, requests, tokens)
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def aclose(self) -> None:
        """Wait for the give-backs in flight."""
        if self._pending:
            await asyncio.gather(*self._pending)

    async def _give_back(self, key_id: str, requests: int, tokens: int) -> None:
        try:
            with redis_errors("giving quota back"):
                await self._give(
                    keys=self._keys(key_id), args=[*self._limits, requests, tokens]
                )
        except RedisUnavailable as exc:
            logger.warning("%s: %d tokens not given back", exc, tokens)

    def _keys(self, key_id: str) -> list[str]:
        base = f"{self._prefix}quota:"
        return [f"{base}requests:{key_id}", f"{base}tokens:{key_id}"]
