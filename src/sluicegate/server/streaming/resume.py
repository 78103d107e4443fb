"""Resume: the rest of an awaitable that was started by hand, awaited by a task.

A frame sink (``sink.py``) drives a write's coroutine by hand from a callback;
when it suspends (the client is behind), the owner's task finishes it by
awaiting a ``Resume``: the same steps, in the same context, with what the task
sends or throws forwarded as ``await`` would.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine, Generator
from typing import Any

__all__ = ["Resume", "Steps"]

logger = logging.getLogger(__name__)

Steps = Coroutine[Any, Any, Any] | Generator[Any, Any, Any]
"""An awaitable's steps: a coroutine, or what ``__await__()`` returns."""


class Resume:
    """Awaits the rest of an awaitable that was started by hand and suspended.

    ``steps`` is the awaitable's steps (a coroutine, or its ``__await__()``
    iterator), ``waiting_on`` what it yielded (the future it waits for); the
    awaiting task waits for that, then goes on driving ``steps`` in ``context``
    (where it started), forwarding what the task sends or throws (cancellation
    included) as ``await`` does.
    """

    __slots__ = ("_context", "_coro", "_waiting_on")

    def __init__(
        self,
        steps: Steps,
        waiting_on: Any,
        context: contextvars.Context,
    ) -> None:
        self._coro = steps
        self._waiting_on = waiting_on
        self._context = context

    def __await__(self) -> Generator[Any, Any, None]:
        coro, waiting_on, run = self._coro, self._waiting_on, self._context.run
        while True:
            try:
                sent = yield waiting_on
            except BaseException as exc:  # forwarded, as ``await`` would
                try:
                    waiting_on = run(coro.throw, exc)
                except StopIteration:
                    return
            else:
                try:
                    waiting_on = run(coro.send, sent)
                except StopIteration:
                    return

    def close(self) -> None:
        """End the awaitable without finishing it, as a cancelled task would.

        ``CancelledError`` is thrown into it, in its context (so its ``finally``
        blocks may reset context variables and even await once more); if it
        waits again, it is closed. Nothing it raises escapes: the write is
        abandoned either way.
        """
        run, coro = self._context.run, self._coro
        try:
            run(coro.throw, asyncio.CancelledError())
        except (StopIteration, asyncio.CancelledError):
            return
        except Exception:  # its own failure while unwinding: nothing to add
            logger.debug("an abandoned write raised while unwinding", exc_info=True)
            return
        try:  # it waits again: it cannot be finished without a task
            run(coro.close)
        except Exception:  # e.g. it ignored GeneratorExit
            logger.debug("an abandoned write did not close", exc_info=True)
