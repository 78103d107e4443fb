"""The writer seam of an event stream: frames to ``send``, each outcome reported.

A writer puts the ``StreamMachine``'s frames on the connection and tells the
machine what became of them (``wrote()``, ``write_failed()``) and the
``WriteWatch`` when each write starts and ends; it decides nothing else.
``TaskWriter`` writes from the stream's own task only: the plain one.
``EagerWriter`` does the same and, while that task waits with nothing queued,
also writes each event from the producer's callback (no task wake-up per token).
Both write the same bytes and report the same outcomes; the streaming tests run
with either (``EventStreamResponse.writer``).

Invariants:
    - Frames go out in the order the machine returned them; nothing is written
      after a failed write.
    - Nothing raises into the producer: an eager failure is kept, and raised or
      reported by the task in ``settle()``.

Spec: docs/DESIGN.md, "Slow consumers".
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine, Generator
from types import CoroutineType
from typing import Any

from starlette.types import Send

from sluicegate.core.events import Delta, StreamEvent
from sluicegate.core.wire import Wire
from sluicegate.server.buffer import StreamBuffer
from sluicegate.server.write_watch import WriteWatch

__all__ = ["EagerWriter", "TaskWriter"]

logger = logging.getLogger(__name__)


class TaskWriter:
    """Writes a stream's frames from the stream's task: the plain writer.

    Args:
        machine: the stream's machine; told ``wrote()`` / ``write_failed()``.
        send: the ASGI ``send`` of the body.
        watch: told ``writing()`` / ``wrote()`` around each write.
        buffer: the stream's buffer (the eager writer takes events from it).
    """

    __slots__ = ("_machine", "_send", "_watch")

    def __init__(
        self,
        machine: Wire,
        send: Send,
        watch: WriteWatch,
        buffer: StreamBuffer,
    ) -> None:
        self._machine = machine
        self._send = send
        self._watch = watch

    async def write(self, body: bytes) -> bool:
        """Send ``body`` (frames, complete) from the task; report the outcome.

        Returns:
            False when the connection broke (``OSError``): the client is gone and
            the machine was told ``write_failed()``.
        """
        self._watch.writing()
        try:
            await self._send(
                {"type": "http.response.body", "body": body, "more_body": True}
            )
        except OSError:
            self._machine.write_failed()
            return False
        self._watch.wrote()
        self._machine.wrote()
        return True

    async def settle(self) -> bool:
        """In the task, after each wake-up: finish what was written for it.

        Returns:
            False when the connection broke (reported to the machine).
        """
        return True

    def close(self) -> None:
        """The stream's writing ended: stop writing for the task."""


class EagerWriter(TaskWriter):
    """A ``TaskWriter`` that also writes events from the producer's callback.

    It is the buffer's ``direct``: called with an event when the stream's task
    waits with nothing queued. The event goes through the ``StreamMachine`` and
    the ASGI ``send`` coroutine is driven by hand (``send(None)``). A server's
    ``send`` finishes without suspending unless the socket is behind (uvicorn:
    its write buffer is over the high-water mark); then the started coroutine is
    handed to the task, which finishes it in ``settle()`` before anything else
    is written. A failure (the socket broke, a bug) is kept for the task too,
    and so is the machine's end: the task is poked in each case.

    This is the work the task would do per token, minus waking it: a future, a
    loop callback and a task step per token per stream (the same idea as Python
    3.12's eager tasks, for one call). Every step of a hand-driven ``send`` runs
    in one copy of the task's context, taken here: a wrapper around ``send``
    that sets and resets a context variable (tracing does) sees its own
    request's values, and resets in the context it set in, even when the task
    finishes the write. What it cannot have is a current task: a ``send`` that
    needs one (an anyio cancel scope around it) fails its stream with
    ``internal_error``. uvicorn's ``send`` needs none.
    """

    __slots__ = ("_buffer", "_context", "_time", "failure", "pending")

    def __init__(
        self,
        machine: Wire,
        send: Send,
        watch: WriteWatch,
        buffer: StreamBuffer,
    ) -> None:
        super().__init__(machine, send, watch, buffer)
        self._buffer = buffer
        self._context = contextvars.copy_context()
        self._time = watch.clock.time
        self.pending: Resume | None = None
        self.failure: Exception | asyncio.CancelledError | None = None
        buffer.direct = self

    def __call__(self, event: StreamEvent) -> None:
        machine = self._machine
        try:
            frames = machine.feed(event)
            if frames:
                body = frames[0] if len(frames) == 1 else b"".join(frames)
                sending = self._send(
                    {"type": "http.response.body", "body": body, "more_body": True}
                )
                steps: Steps = (
                    sending  # a coroutine has send() and throw() itself
                    if isinstance(sending, CoroutineType)
                    else sending.__await__()
                )
                try:
                    waiting_on = self._context.run(steps.send, None)
                except StopIteration:
                    # watch.wrote(), inline: no write of the task is in
                    # flight while it waits, so write_started is None already.
                    self._watch.last_write = self._time()
                    if type(event) is not Delta:  # content moves no outcome
                        machine.wrote()
                else:  # the socket is behind: the task finishes this write
                    self._watch.writing()
                    self.pending = Resume(steps, waiting_on, self._context)
                    self._buffer.poke()
                    return
        except (Exception, asyncio.CancelledError) as exc:  # the task raises it
            self.failure = exc
            self._buffer.poke()
            return
        # Only an End or a Fail ends the machine: the task returns then.
        if type(event) is not Delta and machine.end_state is not None:
            self._buffer.poke()

    async def settle(self) -> bool:
        """In the task: finish a handed-over write, raise a kept failure.

        Returns:
            False when the connection broke (reported to the machine).

        Raises:
            Exception: a bug met in ``__call__``, re-raised here (so is a
                ``CancelledError`` that ``send`` raised there).
        """
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                await pending
            except OSError:
                self._machine.write_failed()
                return False
            self._watch.wrote()
            self._machine.wrote()
        failure, self.failure = self.failure, None
        if isinstance(failure, OSError):
            self._machine.write_failed()
            return False
        if failure is not None:
            raise failure
        return True

    def close(self) -> None:
        """Stop writing eagerly; drop a handed-over write the task did not finish
        (it was stopped), and a failure it did not take."""
        self._buffer.direct = None
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.close()
        # A failure the task did not take (it was stopped) goes too: its
        # traceback holds this writer, a cycle only the collector would free.
        self.failure = None


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


WriterType = Callable[[Wire, Send, WriteWatch, StreamBuffer], TaskWriter]
"""What builds a stream's writer: ``TaskWriter`` or ``EagerWriter``."""
