"""The Lua scripts of ``RedisEventStore``: each one atomic in Redis.

Keys, for prefix ``P`` and response id ``R`` (all of a log's keys expire
together, ``ttl_s`` after ``finish``, or ``lease_s + ttl_s`` after the producer's
last lease while it runs):

- ``P log:R``: a Redis Stream; frame ``seq`` is the entry ``0-(seq+1)``, field
  ``f``; after the last frame, ``finish`` adds the end entry (field ``e``).
- ``P meta:R``: a hash: ``owner``, ``next`` (frames appended), ``first`` (the
  oldest kept frame's seq), ``bytes`` (frame bytes kept), ``done``, ``reads``,
  ``hash`` and ``idem`` (the idempotency binding and its key's name),
  ``record`` (``set_record``'s document, when one was kept).
- ``P lease:R``: the producer's lease (``PX lease_s``); gone while ``done`` is
  not set means the producer was lost.
- ``P readers:R``: a sorted set of reader ids scored by their lease's end (ms).
- ``P idem:<owner length>:<owner>:<key>``: the response id an idempotency key
  is bound to.
- ``P total``, ``P sizes``, ``P expiry``, ``P finished``: the store-wide
  account: bytes kept over all logs, each log's bytes, when each log expires,
  when each finished log finished (ms). Expired logs leave the account lazily
  (``sweep``, at most 64 per script run).

The scripts name keys they compute from ``P`` rather than declare (fine on one
Redis server; not for Redis Cluster). Times are Redis's ``TIME`` in ms, so the
replicas' clocks never matter.

Spec: Redis documentation, "Scripting with Lua", "Streams" (explicit entry ids).
"""

from __future__ import annotations

__all__ = ["ATTACH", "ATTACHED", "CREATE", "FORGET", "REFRESH", "SET_RECORD", "WRITE"]

_COMMON = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function forget(P, R)
  local meta = P .. 'meta:' .. R
  local idem = redis.call('HGET', meta, 'idem')
  if idem and idem ~= '' then redis.call('DEL', idem) end
  redis.call('DEL', meta, P .. 'log:' .. R, P .. 'lease:' .. R, P .. 'readers:' .. R)
  local size = tonumber(redis.call('ZSCORE', P .. 'sizes', R) or '0')
  redis.call('ZREM', P .. 'sizes', R)
  redis.call('ZREM', P .. 'expiry', R)
  redis.call('ZREM', P .. 'finished', R)
  redis.call('DECRBY', P .. 'total', size)
  return size
end
local function sweep(P, now)
  local gone = redis.call('ZRANGEBYSCORE', P .. 'expiry', '-inf', now, 'LIMIT', 0, 64)
  for _, R in ipairs(gone) do forget(P, R) end
end
local function evict_finished(P, nbytes)
  local freed = 0
  while freed < nbytes do
    local oldest = redis.call('ZRANGE', P .. 'finished', 0, 0)
    if #oldest == 0 then break end
    freed = freed + forget(P, oldest[1])
  end
  return freed
end
local function keep_until(P, R, at_ms, now)
  local ms = at_ms - now
  local meta = P .. 'meta:' .. R
  redis.call('PEXPIRE', meta, ms)
  redis.call('PEXPIRE', P .. 'log:' .. R, ms)
  redis.call('PEXPIRE', P .. 'readers:' .. R, ms)
  local idem = redis.call('HGET', meta, 'idem')
  if idem and idem ~= '' then redis.call('PEXPIRE', idem, ms) end
  redis.call('ZADD', P .. 'expiry', at_ms, R)
end
"""

CREATE = (
    _COMMON
    + """
local P, R, owner = ARGV[1], ARGV[2], ARGV[3]
local lease_ms, ttl_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local max_store = tonumber(ARGV[6])
local idem, body_hash = ARGV[7], ARGV[8]
local now = now_ms()
sweep(P, now)
if idem ~= '' then
  local bound = redis.call('GET', idem)
  if bound then
    local h = redis.call('HGET', P .. 'meta:' .. bound, 'hash')
    if h then return {'bound', bound, h} end
  end
end
local total = tonumber(redis.call('GET', P .. 'total') or '0')
if total >= max_store then
  total = total - evict_finished(P, total - max_store + 1)
  if total >= max_store then return {'full', tostring(total)} end
end
local meta = P .. 'meta:' .. R
redis.call('HSET', meta, 'owner', owner, 'next', 0, 'first', 0, 'bytes', 0,
           'done', 0, 'reads', 0, 'hash', body_hash, 'idem', idem)
if idem ~= '' then redis.call('SET', idem, R) end
redis.call('SET', P .. 'lease:' .. R, 1, 'PX', lease_ms)
redis.call('ZADD', P .. 'sizes', 0, R)
keep_until(P, R, now + lease_ms + ttl_ms, now)
return {'ok'}
"""
)
"""ARGV: prefix, id, owner, lease ms, ttl ms, max store bytes, idempotency key's
name ('' for none), body hash. Returns ``{'ok'}``, ``{'bound', id, hash}`` or
``{'full', total}``."""

WRITE = (
    _COMMON
    + """
local P = ARGV[1]
local max_log, max_store = tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms, ttl_ms = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
sweep(P, now)
local function trim(log, first, last, nbytes)
  local dropped = 0
  while dropped < nbytes and first < last do
    local batch = redis.call('XRANGE', log, '0-' .. (first + 1), '+', 'COUNT', 64)
    if #batch == 0 then break end
    for _, entry in ipairs(batch) do
      if dropped >= nbytes or first >= last then break end
      dropped = dropped + #entry[2][2]
      first = first + 1
    end
  end
  redis.call('XTRIM', log, 'MINID', '0-' .. (first + 1))
  return dropped, first
end
local function append(R, meta, log, i, count)
  local m = redis.call('HMGET', meta, 'next', 'first', 'bytes', 'done')
  if not m[1] or m[4] == '1' then return -1 end
  local nxt, first, bytes = tonumber(m[1]), tonumber(m[2]), tonumber(m[3])
  local added = 0
  for j = i, i + count - 1 do
    nxt = nxt + 1
    redis.call('XADD', log, '0-' .. nxt, 'f', ARGV[j])
    added = added + #ARGV[j]
  end
  bytes = bytes + added
  local total = redis.call('INCRBY', P .. 'total', added)
  local drop = math.max(bytes - max_log, 0)
  local over = total - drop - max_store
  if over > 0 then over = over - evict_finished(P, over) end
  if over > 0 then drop = drop + over end
  if drop > 0 then
    local dropped
    dropped, first = trim(log, first, nxt - 1, drop)
    bytes = bytes - dropped
    redis.call('DECRBY', P .. 'total', dropped)
  end
  redis.call('HSET', meta, 'next', nxt, 'first', first, 'bytes', bytes)
  redis.call('ZADD', P .. 'sizes', bytes, R)
  return nxt
end
local function lease(R, meta)
  if redis.call('HGET', meta, 'done') ~= '0' then return -1 end
  redis.call('SET', P .. 'lease:' .. R, 1, 'PX', lease_ms)
  keep_until(P, R, now + lease_ms + ttl_ms, now)
  return 0
end
local function finish(R, meta, log)
  local nxt = redis.call('HGET', meta, 'next')
  if not nxt or redis.call('HGET', meta, 'done') ~= '0' then return -1 end
  redis.call('XADD', log, '0-' .. (tonumber(nxt) + 1), 'e', 1)
  redis.call('HSET', meta, 'done', 1)
  redis.call('DEL', P .. 'lease:' .. R)
  redis.call('ZADD', P .. 'finished', now, R)
  keep_until(P, R, now + ttl_ms, now)
  return tonumber(nxt)
end
local out = {}
local i = 6
while i <= #ARGV do
  local R, op, count = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local meta, log = P .. 'meta:' .. R, P .. 'log:' .. R
  local result
  if op == 'a' then result = append(R, meta, log, i + 3, count)
  elseif op == 'l' then result = lease(R, meta)
  else result = finish(R, meta, log) end
  table.insert(out, result)
  i = i + 3 + count
end
return out
"""
)
"""ARGV: prefix, max log bytes, max store bytes, lease ms, ttl ms, then records
``id, op, count, frame * count`` in order: op ``a`` appends the frames, ``l``
leases, ``f`` finishes. A log that is gone or finished takes nothing. Returns one
integer per record: -1 when it took nothing, else for ``a`` the frames appended
so far, for ``f`` the end entry's seq, for ``l`` 0."""

ATTACH = (
    _COMMON
    + """
local P, R, owner = ARGV[1], ARGV[2], ARGV[3]
local after, reader, lease_ms = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local now = now_ms()
sweep(P, now)
local meta = P .. 'meta:' .. R
local m = redis.call('HMGET', meta, 'owner', 'first', 'done', 'next')
if not m[1] or m[1] ~= owner then return {'missing'} end
if after + 1 < tonumber(m[2]) then return {'evicted', m[2]} end
if m[3] == '1' and after + 1 >= tonumber(m[4]) then
  redis.call('HINCRBY', meta, 'reads', 1)
  return {'ended'}
end
local readers = P .. 'readers:' .. R
redis.call('ZADD', readers, now + lease_ms, reader)
redis.call('PEXPIRE', readers, math.max(redis.call('PTTL', meta), 1))
redis.call('HINCRBY', meta, 'reads', 1)
return {'ok'}
"""
)
"""ARGV: prefix, id, owner, cursor, reader id, lease ms. Returns ``{'ok'}``
(the reader is attached), ``{'missing'}``, ``{'evicted', first kept seq}`` or
``{'ended'}`` (a finished log with no frame after the cursor: the read counts,
and nothing is attached)."""

REFRESH = (
    _COMMON
    + """
local P, lease_ms = ARGV[1], tonumber(ARGV[2])
local now = now_ms()
local out = {}
local i = 3
while i <= #ARGV do
  local R, count = ARGV[i], tonumber(ARGV[i + 1])
  local m = redis.call('HMGET', P .. 'meta:' .. R, 'done', 'first')
  local state = 'lost'
  if not m[1] then state = 'gone'
  elseif m[1] == '1' or redis.call('EXISTS', P .. 'lease:' .. R) == 1 then
    state = 'live'
  end
  for j = i + 2, i + 1 + count do
    redis.call('ZADD', P .. 'readers:' .. R, 'XX', now + lease_ms, ARGV[j])
  end
  table.insert(out, state)
  i = i + 2 + count
end
return out
"""
)
"""ARGV: prefix, reader lease ms, then records ``id, count, reader * count``:
extends those readers' leases and returns, per id, ``live`` (finished, or its
producer leases), ``lost`` (its lease lapsed before ``finish``) or ``gone``."""

ATTACHED = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
"""KEYS: the readers set. Returns how many readers' leases have not ended."""

SET_RECORD = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'record', ARGV[1])
  return 1
end
return 0
"""
"""KEYS: the meta hash. ARGV: the record. Returns 1 when kept, 0 (a log gone)."""

FORGET = (
    _COMMON
    + """
local P, R, owner = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', P .. 'meta:' .. R, 'owner') ~= owner then return 0 end
forget(P, R)
return 1
"""
)
"""ARGV: prefix, id, owner. Forgets the log when ``owner``'s; returns 1, else 0."""
