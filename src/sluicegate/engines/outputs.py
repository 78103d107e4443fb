"""The output channel of one engine sequence: iterate it, or listen to it.

An engine hands each ``generate()`` caller a ``SequenceOutputs``. The engine side
calls ``push`` (one ``EngineOutput`` or ``TextOutput`` per step), ``fail`` (an
``EngineError``) or ``end`` (the sequence stopped without a finish reason: it was
aborted), always on the event loop's thread. The consumer side either iterates it
(``async for``, the engine protocols' plain contract) or calls ``listen`` once
(it is ``ListenableOutputs``, the protocol's listener contract): each later item
is then handed to the listener synchronously from ``push``, with no task switch
and no queue. A server with thousands of streams pays one task wake-up per token
less that way (see ``bench/streams.py``).

Invariants:
    - Items reach the consumer in push order; nothing follows the output that
      carries a ``finish_reason``, a ``fail`` or an ``end``.
    - A listener is never re-entered: what the engine pushes while the listener
      runs (it may abort its own sequence) is handed over after it returns.
    - ``push``/``fail``/``end`` never block and never raise because of the
      consumer: an exception from a listener is logged, the sequence is aborted
      and the listener is dropped.
    - ``close()`` (or ``aclose()``) before the sequence ended calls the engine's
      abort callback once; items pushed later are dropped, and a consumer waiting
      in ``__anext__`` stops. Unlike an async generator, it is not closed by the
      garbage collector: a consumer that leaves an ``async for`` early closes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from sluicegate.core.errors import EngineError
from sluicegate.core.events import EngineOutput, TextOutput
from sluicegate.engines.base import OutputItem, OutputListener

__all__ = ["SequenceOutputs"]

logger = logging.getLogger(__name__)

_O = TypeVar("_O", EngineOutput, TextOutput)


class SequenceOutputs(Generic[_O]):
    """The outputs of one engine sequence: an ``AsyncIterator`` of ``EngineOutput``
    (or of ``TextOutput``, for an engine that yields text) and
    ``ListenableOutputs``.

    Args:
        on_close: called once when the consumer closes the channel before the
            sequence ended (the engine aborts the sequence there).

    Iteration raises ``EngineError`` for a failed sequence and stops after the
    output that carries ``finish_reason``, or at ``end()``.
    """

    __slots__ = (
        "_closed",
        "_delivering",
        "_done",
        "_items",
        "_listener",
        "_on_close",
        "_waiter",
    )

    def __init__(self, on_close: Callable[[], None]) -> None:
        self._on_close = on_close
        self._items: deque[_O | EngineError | None] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._listener: OutputListener | None = None
        self._done = False  # the engine delivered its last item
        self._closed = False  # the consumer is gone
        self._delivering = False  # the listener is running

    # -- engine side ---------------------------------------------------------

    def push(self, output: _O) -> None:
        """Deliver one decode step; its ``finish_reason`` ends the sequence."""
        listener = self._listener
        if (
            listener is None
            or self._delivering
            or self._items
            or self._done
            or output.finish_reason is not None
        ):
            self._deliver(output, output.finish_reason is not None)
            return
        # Once per token: ``_deliver``'s common case (an idle listener, nothing
        # queued, not the last item), without its two calls.
        self._delivering = True
        try:
            listener(output)
        except Exception:  # as in _call
            logger.exception("a sequence's output listener failed; aborting it")
            self.close()
        finally:
            self._delivering = False
        if self._items:  # pushed again from inside the listener
            self._drain_to(listener)

    def fail(self, error: EngineError) -> None:
        """End the sequence with ``error``."""
        self._deliver(error, True)

    def end(self) -> None:
        """End the sequence without a finish reason (it was aborted)."""
        self._deliver(None, True)

    @property
    def queued(self) -> int:
        """Items delivered and not yet taken (none while a listener keeps up)."""
        return len(self._items)

    @property
    def done(self) -> bool:
        """Whether the engine delivered its last item (finish, failure or end)."""
        return self._done

    # -- consumer side -------------------------------------------------------

    async def first(self) -> _O | None:
        """The first output, once the engine delivered one, left for the
        consumer (call before ``listen`` or iterating); ``None`` when the
        sequence failed or ended without one."""
        while not self._items and not self._done and not self._closed:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items[0] if self._items else None
        return None if item is None or isinstance(item, EngineError) else item

    def listen(self, listener: OutputListener) -> None:
        """Hand every item to ``listener`` from now on, queued ones first.

        Raises:
            RuntimeError: the channel is already being listened to or closed.
        """
        if self._listener is not None or self._closed:
            raise RuntimeError("expected an open channel that nobody listens to")
        self._listener = listener
        self._drain_to(listener)

    def close(self) -> None:
        """Stop consuming: drop later items; abort the sequence if it is running."""
        if self._closed:
            return
        self._closed = True
        self._listener = None
        self._items.clear()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)  # a waiting __anext__ sees the close and stops
        if not self._done:
            self._on_close()

    async def aclose(self) -> None:
        """``close()``, as the async iterator protocol spells it."""
        self.close()

    def __aiter__(self) -> SequenceOutputs[_O]:
        return self

    async def __anext__(self) -> _O:
        while not self._items:
            if self._closed or (self._done and not self._items):
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if item is None:
            self._closed = True
            raise StopAsyncIteration
        if isinstance(item, EngineError):
            self._closed = True
            raise item
        return item

    # -- internals -----------------------------------------------------------

    def _deliver(self, item: _O | EngineError | None, last: bool) -> None:
        if self._done or self._closed:
            return
        self._done = last
        listener = self._listener
        if listener is not None and not self._delivering and not self._items:
            self._delivering = True
            try:
                self._call(listener, item)
            finally:
                self._delivering = False
            self._drain_to(listener)
            return
        self._items.append(item)
        if listener is not None:
            if not self._delivering:
                self._drain_to(listener)
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _drain_to(self, listener: OutputListener) -> None:
        """Hand queued items to ``listener`` while it is still the listener."""
        self._delivering = True
        try:
            while self._items and self._listener is listener:
                self._call(listener, self._items.popleft())
        finally:
            self._delivering = False

    def _call(self, listener: OutputListener, item: OutputItem) -> None:
        try:
            listener(item)
        except Exception:  # a consumer's bug must not stop the engine's loop
            logger.exception("a sequence's output listener failed; aborting it")
            self.close()
