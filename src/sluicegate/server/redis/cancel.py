"""Cancel requests between replicas: one Redis pub/sub channel, one listener each.

A resumable stream is produced by the replica that admitted it, which alone
holds its engine request; a cancel (``POST /v1/responses/{id}/cancel``) may
land on any replica. ``CancelChannel.publish`` sends the response id on the
channel ``<prefix>cancel``; every replica's listener task hands each id it
receives to its handler, which cancels the producer when it runs there (and
ignores the id otherwise). One subscription per replica, nothing per stream.

Invariants:
    - Delivery is at most once, as Redis pub/sub is: a replica that is not
      subscribed at that moment (restarting, Redis unreachable) misses it. The
      caller waits for the response to end and answers a conflict when it does
      not.
    - The listener starts with the first ``start`` on a running loop, retries
      every ``RETRY_S`` (on ``timers``) while Redis is unreachable, and ends
      with ``aclose``.

Spec: Redis documentation, "Pub/Sub".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.redis.client import redis_errors

__all__ = ["RETRY_S", "CancelChannel"]

logger = logging.getLogger(__name__)

RETRY_S = 1.0
"""Seconds between the listener's attempts to subscribe while Redis is down."""


class CancelChannel:
    """Publishes and listens for cancel requests (see the module doc).

    Args:
        client: a ``redis.asyncio`` client (the caller closes it).
        prefix: the start of the channel's name.

    Attributes:
        timers: the clock of the listener's retries (``None``: the running loop).
    """

    timers: Timers | None = None

    def __init__(self, client: Any, prefix: str) -> None:
        self._client = client
        self._channel = prefix + "cancel"
        self._handler: Callable[[str], None] | None = None
        self._task: asyncio.Task[None] | None = None

    def listen(self, handler: Callable[[str], None]) -> None:
        """Hand every id received to ``handler`` (called on the loop)."""
        self._handler = handler

    def start(self) -> None:
        """Start the listener task once (a no-op after the first call)."""
        if self._task is None and self._handler is not None:
            self._task = asyncio.get_running_loop().create_task(self._listen())

    async def publish(self, response_id: str) -> bool:
        """Ask every replica to cancel ``response_id``; whether any listens.

        Raises:
            RedisUnavailable: Redis cannot be reached.
        """
        with redis_errors("publishing a cancel"):
            receivers = await self._client.publish(self._channel, response_id)
        return int(receivers) > 0

    async def aclose(self) -> None:
        """Stop listening."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _listen(self) -> None:
        from redis.exceptions import RedisError

        while True:
            pubsub = self._client.pubsub()
            try:
                await pubsub.subscribe(self._channel)
                while True:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=1.0
                    )
                    if message is not None and self._handler is not None:
                        self._handler(bytes(message["data"]).decode())
            except (RedisError, OSError) as exc:
                logger.warning("cancel channel: %s; retrying", exc)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()
            timers = self.timers or asyncio.get_running_loop()
            await Deadline(timers, RETRY_S).passed()
