"""The Redis connection of a server whose quotas and resumable logs are shared.

``connect(url)`` opens a ``redis.asyncio`` client (its pool connects on first
use), and ``redis_errors()`` turns every failure to reach Redis into one
``RedisUnavailable``; ``redis_unreachable(url)`` is the start-up check, one
blocking ``PING``. ``redis`` (redis-py) is imported here only, and only when a
server is configured with ``redis_url``: a server without Redis never loads it.

Invariants:
    - A command that cannot reach Redis fails within about
      ``CONNECT_TIMEOUT_S`` (connect) or ``COMMAND_TIMEOUT_S`` (reply), after one
      retry at most; the server never waits on a dead Redis for long.
    - Replies are bytes (``decode_responses`` off): frames go in and out as
      written.

Spec: Redis documentation, "Pipelining" and "Scripting with Lua".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from sluicegate.server.http.errors import RedisFull, RedisUnavailable

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "COMMAND_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "connect",
    "redis_errors",
    "redis_unreachable",
]

CONNECT_TIMEOUT_S = 1.0
COMMAND_TIMEOUT_S = 5.0
"""Seconds for one reply; longer than any ``XREAD BLOCK`` this server sends."""
MAX_CONNECTIONS = 64
"""Connections of one server's pool: producers share one flusher and readers one
tail, so few are in use at once; past it a command waits for one (at most
``COMMAND_TIMEOUT_S``)."""


def connect(url: str) -> Redis:
    """A client of the Redis at ``url`` (``redis://host:port/db``); lazy.

    Raises:
        ValueError: ``url`` is not a Redis URL.
    """
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    # A full pool makes a command wait for a connection (the plain pool
    # raises at once): 1,000 streams starting together must not fail.
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=COMMAND_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=COMMAND_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
    )
    client: Redis = Redis.from_pool(pool)  # closing the client closes the pool
    return client


@contextmanager
def redis_errors(doing: str) -> Iterator[None]:
    """Raise ``RedisUnavailable`` (naming ``doing``) for any Redis or socket
    failure inside the block; ``RedisFull`` for a write Redis refused at
    ``maxmemory``.

    Raises:
        RedisUnavailable: from the redis-py error or ``OSError`` it replaces.
    """
    from redis.exceptions import OutOfMemoryError, RedisError

    try:
        yield
    except OutOfMemoryError as exc:
        raise RedisFull(f"Redis is full (maxmemory) while {doing}") from exc
    except (RedisError, OSError) as exc:
        raise RedisUnavailable(f"Redis failed while {doing}: {exc}") from exc


def redis_unreachable(url: str, timeout_s: float = 1.0) -> str | None:
    """Why the Redis at ``url`` does not answer a ``PING`` within about
    ``timeout_s`` seconds (connect, then reply), or ``None`` when it does.

    Raises:
        ValueError: ``url`` is not a Redis URL (``redis://``, ``rediss://``,
            ``unix://``).
    """
    import redis

    client = redis.Redis.from_url(
        url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        return str(exc) or type(exc).__name__
    finally:
        client.close()
    return None
