"""The frame sink: the one place a streamed response's frames are written.

Every streamed response writes through a ``FrameSink``: a live stream (direct
or through the gateway) and a log's reader to their connection's ASGI ``send``
(``body_writes``), a resumable stream's producer to its log. A sink writes from
its owner's task (``write``) or, while that task waits, at once from a callback
(``offer``: the engine's callback, a store's push, a heartbeat timer). There it
drives the destination's coroutine by hand (``send(None)``): a server's
``send`` finishes without suspending unless the socket is behind (uvicorn: its
write buffer is over the high-water mark), and then the started write is
finished later, by the owner's task (``settle``, after ``on_pending`` woke it)
or by a task of the sink's own (an owner that waits on something it cannot be
woken from, a log's reader). This is the work the task would do per token,
minus waking it: a future, a loop callback and a task step per token per
stream. A destination that can write without a coroutine (``now``: the
server's ``ChunkedBodySend.write_now``, while its transport takes writes)
is written that way first, from either side: no message, no coroutine and no
``StopIteration`` per token. The sink tells its ``WriteWatch`` when each write
starts and ends.

Every step of a hand-driven write runs in one copy of the owner task's context,
taken at construction: a wrapper around ``send`` that sets and resets a context
variable (tracing does) sees its own request's values, even when a task
finishes the write. What it cannot have is a current task: a ``send`` that
needs one (an anyio cancel scope around it) fails its stream. uvicorn's
``send`` needs none.

Invariants:
    - Writes never interleave: ``offer`` refuses (``BUSY``) while a write is in
      flight, started, or failed and not yet settled; ``write`` settles first.
    - Nothing raises into a callback: a failure met in ``offer`` is kept and
      raised (or, a broken connection, reported) by ``settle``.
    - ``close()`` abandons a started write its owner did not finish (the
      owner was stopped) and drops a failure it did not take.

Spec: docs/DESIGN.md, "Slow consumers"; ASGI, "HTTP" (``http.response.body``).
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
from collections.abc import Awaitable, Callable, Sequence
from types import CoroutineType

from starlette.types import Send

from sluicegate.server.http.chunked_body import ChunkedBodySend
from sluicegate.server.streaming.resume import Resume, Steps
from sluicegate.server.streaming.write_watch import WriteWatch

__all__ = ["FrameSink", "Offered", "Resume", "Steps", "body_writes", "body_writes_now"]

Frames = Sequence[bytes]
"""Complete frames, in order (each an event or comment with its blank line)."""


class Offered(enum.Enum):
    """What ``FrameSink.offer`` did with the frames."""

    WROTE = "wrote"
    """They went out whole, now."""
    STARTED = "started"
    """Their write started and waits for the client; it is finished later."""
    FAILED = "failed"
    """Their write failed; the failure is kept for ``settle``."""
    BUSY = "busy"
    """Nothing was done: a write is in flight or a failure waits (the caller
    keeps the frames for its task)."""


WROTE, STARTED, FAILED, BUSY = Offered


def body_writes(send: Send) -> Callable[[Frames], Awaitable[None]]:
    """The write of frames as one ``http.response.body`` part (``more_body``)."""

    def write(frames: Frames) -> Awaitable[None]:
        body = frames[0] if len(frames) == 1 else b"".join(frames)
        return send({"type": "http.response.body", "body": body, "more_body": True})

    return write


def body_writes_now(send: Send) -> Callable[[Frames], bool] | None:
    """The write of frames as one body part without a coroutine, for a ``send``
    that has one (``ChunkedBodySend.write_now``: False when it cannot write
    now); ``None`` for any other ``send``."""
    return send.write_now if isinstance(send, ChunkedBodySend) else None


class FrameSink:
    """The writes of one destination, from its owner's task or from callbacks.

    Args:
        start: starts the write of some frames (``body_writes(send)``, a log's
            append): returns its awaitable, which is driven by hand in ``offer``
            and awaited in ``write``.
        watch: told ``writing()``/``wrote()`` around each write; ``None``: no
            heartbeats or stuck writes to time (a producer's log).
        on_pending: wakes the owner's task after ``offer`` started a write that
            it must finish, or met a failure (``settle``); ``None``: the sink
            finishes a started write in a task of its own, and reports a broken
            connection there through ``on_broken``.
        on_broken: see ``on_pending``.
        at_once: writes frames without a coroutine (the memory log's append):
            ``offer`` then calls it instead of driving ``start``.
        broken: what a write raises when its connection broke (reported as
            ``False``, not raised); ``()`` for a destination whose failures
            are all its owner's to handle (a log).
        now: writes frames at once without a coroutine when it can
            (``body_writes_now``), and says False when it cannot: ``start``
            then writes them. The same bytes as ``start``'s.

    Attributes:
        pending: a write ``offer`` started that the owner's task finishes.
        failure: what ``offer`` (or the sink's own task) met, for ``settle``.
        sending: a write of the owner's task, or the sink's own, is in flight.
    """

    __slots__ = (
        "_at_once",
        "_broken",
        "_context",
        "_finisher",
        "_now",
        "_on_broken",
        "_on_pending",
        "_start",
        "_time",
        "_watch",
        "failure",
        "pending",
        "sending",
    )

    def __init__(
        self,
        start: Callable[[Frames], Awaitable[object]],
        watch: WriteWatch | None,
        *,
        on_pending: Callable[[], None] | None = None,
        on_broken: Callable[[], None] | None = None,
        at_once: Callable[[Frames], None] | None = None,
        broken: tuple[type[BaseException], ...] = (OSError,),
        now: Callable[[Frames], bool] | None = None,
    ) -> None:
        self._start = start
        self._now = now
        self._broken = broken
        self._watch = watch
        self._time = watch.clock.time if watch is not None else _no_time
        self._on_pending = on_pending
        self._on_broken = on_broken
        self._at_once = at_once
        self._context = contextvars.copy_context()
        self._finisher: asyncio.Task[None] | None = None
        self.pending: Resume | None = None
        self.failure: BaseException | None = None
        self.sending = False

    @property
    def idle(self) -> bool:
        """Whether ``offer`` would write now (nothing in flight, nothing kept)."""
        return not (
            self.sending
            or self.pending is not None
            or self.failure is not None
            or self._finisher is not None
        )

    def offer(self, frames: Frames, *, lossy: bool = False) -> Offered:
        """Write ``frames`` now, from a callback, unless the sink is busy.

        ``lossy`` frames (a heartbeat) may be lost: a broken connection met
        while writing them is neither kept nor reported (the owner's next
        write meets it). Once per token per stream: kept flat.

        Returns:
            ``WROTE``, ``STARTED`` (finished later: see the class), ``FAILED``
            (kept for ``settle``) or ``BUSY`` (nothing done).
        """
        if (
            self.sending
            or self.pending is not None
            or self.failure is not None
            or self._finisher is not None
        ):
            return BUSY
        at_once = self._at_once
        if at_once is not None:
            try:
                at_once(frames)
            except Exception as exc:  # the owner's task raises it
                return self._failed(exc)
            return WROTE
        now = self._now
        if now is not None:
            try:
                written = now(frames)
            except Exception as exc:  # the owner raises it, as below
                if lossy and isinstance(exc, self._broken):
                    return FAILED
                return self._failed(exc)
            if written:  # as a send that did not suspend, below
                watch = self._watch
                if watch is not None:
                    watch.last_write = self._time()
                return WROTE
        try:
            sending = self._start(frames)
            steps: Steps = (
                sending  # a coroutine has send() and throw() itself
                if isinstance(sending, CoroutineType)
                else sending.__await__()
            )
            waiting_on = self._context.run(steps.send, None)
        except StopIteration:
            watch = self._watch
            if watch is not None:
                # watch.wrote(), inline: no write is in flight (the sink is
                # idle), so write_started is None already.
                watch.last_write = self._time()
            return WROTE
        except (Exception, asyncio.CancelledError) as exc:  # the owner raises it
            if lossy and isinstance(exc, self._broken):
                return FAILED
            return self._failed(exc)
        # The client is behind: the write is finished later.
        if self._watch is not None:
            self._watch.writing()
        resume = Resume(steps, waiting_on, self._context)
        if self._on_pending is not None:
            self.pending = resume
            self._on_pending()
        else:
            self.sending = True
            loop = asyncio.get_running_loop()
            self._finisher = loop.create_task(self._finish(resume, lossy))
        return STARTED

    def _failed(self, exc: BaseException) -> Offered:
        self.failure = exc
        if self._on_pending is not None:
            self._on_pending()
        return FAILED

    async def _finish(self, resume: Resume, lossy: bool) -> None:
        """Finish a started write in the sink's own task. A broken connection
        is reported at once (``on_broken``: the owner may wait on something
        else for long), unless the write was ``lossy``; any other failure is
        kept for the owner to raise."""
        try:
            await resume
            if self._watch is not None:
                self._watch.wrote()
        except self._broken:
            if self._on_broken is not None and not lossy:
                self._on_broken()
        except Exception as exc:  # the owner's task raises it
            self.failure = exc
        finally:
            self.sending = False
            self._finisher = None

    async def write(self, frames: Frames) -> bool:
        """Write ``frames`` from the owner's task, after what ``offer`` started.

        An empty ``frames`` only settles.

        Returns:
            False when the connection broke (``OSError``).

        Raises:
            Exception: a failure ``offer`` met, or one of the write's own that
                is not an ``OSError`` (a store's error, a bug).
        """
        if not self.idle and not await self.settle():
            return False
        if not frames:
            return True
        watch = self._watch
        now = self._now
        if now is not None:
            try:
                written = now(frames)
            except self._broken:
                return False
            if written:
                if watch is not None:
                    watch.wrote()
                return True
        self.sending = True
        if watch is not None:
            watch.writing()
        try:
            await self._start(frames)
        except self._broken:
            return False
        finally:
            self.sending = False
        if watch is not None:
            watch.wrote()
        return True

    async def settle(self) -> bool:
        """In the owner's task: finish what ``offer`` started, raise what it met.

        Returns:
            False when the connection broke.

        Raises:
            Exception: a failure met in ``offer`` or the sink's own task,
                re-raised here (so is a ``CancelledError`` that ``send`` raised
                there).
        """
        finisher = self._finisher
        if finisher is not None:
            await asyncio.shield(finisher)
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                await pending
            except self._broken:
                return False
            if self._watch is not None:
                self._watch.wrote()
        failure, self.failure = self.failure, None
        if isinstance(failure, self._broken):
            return False
        if failure is not None:
            raise failure
        return True

    async def flushed(self) -> None:
        """Return once a write the sink's own task finishes has ended."""
        finisher = self._finisher
        if finisher is not None:
            await asyncio.shield(finisher)

    def close(self) -> None:
        """The writing ended: abandon a started write nobody finished, drop a
        failure nobody took (its traceback may hold the owner: a cycle only the
        collector would free)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.close()
        finisher, self._finisher = self._finisher, None
        if finisher is not None:
            finisher.cancel()
        self.failure = None


def _no_time() -> float:
    return 0.0
