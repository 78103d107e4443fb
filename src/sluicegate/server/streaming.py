"""The two ASGI responses of a generation, each raced against the client leaving.

This is the only module that watches for ``http.disconnect``. ``EventStreamResponse``
writes an SSE stream; ``CompletionResponse`` waits for the whole answer and writes
one JSON body. In both, ``Generation.attach`` decodes the engine's outputs into a
buffer as they come, the request's own task drains it (for a stream, while that
task waits with nothing queued, the engine's callback writes the event itself:
``_EagerWrites``), and one more task awaits ``receive()``: when the client
disconnects, the request's task is stopped (for a stream: cancelled with a
reason, see ``_Stop``; for a JSON answer: its anyio task group) and every engine
sequence still running is aborted, whether the request is queued, in prefill
or decoding.

Invariants:
    - The stream's headers go out at once: ``200``, ``text/event-stream``,
      ``Cache-Control: no-cache``, ``X-Accel-Buffering: no``, no
      ``Content-Length``, never compressed. Frames come only from ``StreamMachine``.
    - A ``: keep-alive`` comment goes out whenever nothing was written for
      ``heartbeat_interval_s`` (queue wait and prefill included).
    - After the headers, a failure is one in-band error event, then the body ends
      without ``[DONE]``. ``except Exception`` appears only in
      ``EventStreamResponse.__call__`` (log, then that event); cancellation is
      always re-raised.
    - Each response reports its end (``EndState`` and HTTP status) exactly once,
      through ``on_end``, after the engine sequences were aborted or ended.
    - Slow clients: the generation writes into a ``StreamBuffer`` that never
      blocks; what piles up while a write waits is coalesced. A buffer over its
      byte bound, or a write the client has not accepted within
      ``stuck_timeout_s``, aborts the engine request and closes (``aborted``).
      The engine and other streams never wait on one client.
    - Timeouts (first token, total) and the shutdown grace period put one
      ``Fail`` into the buffer: an in-band error for a stream, a 503/504 JSON
      error for a non-streaming response.

Spec: ../shared/DESIGN.md, "The wire", "Status first, errors in band" and "Every
stream ends in exactly one state"; WHATWG HTML, "9.2 Server-sent events".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterator
from dataclasses import dataclass
from types import CoroutineType
from typing import Any, TypeVar

import anyio
from starlette.types import Message, Receive, Scope, Send

from sluicegate.core.chunks import (
    Endpoint,
    ResponseHeader,
    chat_completion,
    dumps,
    error_payload,
    text_completion,
)
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineUnavailable, LocalProtocolError
from sluicegate.core.events import Delta, End, Fail, Heartbeat, StreamEvent
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.stream import StreamMachine
from sluicegate.server.buffer import LiveStreams, StreamBuffer
from sluicegate.server.generation import Generation, Outbox

__all__ = [
    "BODY_SEND",
    "CLIENT_CLOSED",
    "FIRST_TOKEN_TIMEOUT",
    "REQUEST_TIMEOUT",
    "SERVER_SHUTDOWN",
    "SSE_HEADERS",
    "CompletionResponse",
    "EventStreamResponse",
    "OnEnd",
    "StreamLimits",
]

logger = logging.getLogger(__name__)

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
"""Headers of every event stream (no ``Content-Length``, no ``Content-Encoding``).

No ``Connection`` either: it is hop-by-hop, and the HTTP layer (h11) writes the
one the client's version needs (none for HTTP/1.1, ``close`` for HTTP/1.0, whose
body it then delimits by closing instead of chunking: RFC 9112, "6.3. Message Body
Length").

.. versionchanged:: 0.2.0
   ``Connection: keep-alive`` is no longer sent: an HTTP/1.0 client got it next
   to the server's ``Connection: close``.
"""

CLIENT_CLOSED = 499
"""The status recorded when the client left before any status was sent (nginx's
convention; it never goes on the wire)."""

FIRST_TOKEN_TIMEOUT = "first_token_timeout"
"""Error code: no token within ``StreamLimits.first_token_timeout_s``."""

REQUEST_TIMEOUT = "request_timeout"
"""Error code: the response did not end within ``StreamLimits.request_timeout_s``."""

SERVER_SHUTDOWN = "server_shutdown"
"""Error code: the server's shutdown grace period ran out (see ``shutdown.py``)."""

OnEnd = Callable[[EndState, int], None]
"""Called once when a response ends: its ``EndState`` and the HTTP status sent."""

BODY_SEND = "sluicegate.body_send"
"""Scope key: the server's own ``send``, put there by the app before any wrapper.

An event stream sends its body frames with it, and only its start through the
``send`` it was called with: Starlette's exception middlewares wrap ``send`` to
learn whether a response started, which two coroutine frames per token would
tell them again and again. A stream never lets an exception out (see
``EventStreamResponse``), so they have nothing to do after the start.
Middleware added inside the app does not see stream bodies; wrap the app from
outside instead."""

_T = TypeVar("_T")


class _Gone:
    """The client disconnected before the work ended."""


_GONE = _Gone()


async def _race_disconnect(
    receive: Receive, work: Callable[[], Awaitable[_T]]
) -> _T | _Gone:
    """Run ``work`` until it returns, or until the client disconnects (``_GONE``)."""
    result: _T | _Gone = _GONE

    async def watch(scope: anyio.CancelScope) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def run(scope: anyio.CancelScope) -> None:
        nonlocal result
        result = await work()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        tg.start_soon(run, tg.cancel_scope)
    return result


async def _send_body(send: Send, body: bytes, *, more_body: bool = True) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """Time and size limits of one response.

    Attributes:
        heartbeat_interval_s: seconds of silence before a ``: keep-alive`` comment.
        first_token_timeout_s: seconds from the start of the response to the
            first token id; then the ``first_token_timeout`` error (``None``: no
            limit).
        request_timeout_s: seconds from the start of the response to its end;
            then the ``request_timeout`` error (``None``: no limit).
        max_buffer_bytes: content bytes (UTF-8) that may wait for a slow client;
            more aborts the stream.
        stuck_timeout_s: seconds one write may wait for the client to accept
            bytes; longer aborts the stream.
        interval_s: after a write with content, seconds before the next one
            (0: write as soon as events come); what comes meanwhile is coalesced.
    """

    heartbeat_interval_s: float = 15.0
    first_token_timeout_s: float | None = None
    request_timeout_s: float | None = None
    max_buffer_bytes: int = 1 << 20
    stuck_timeout_s: float = 30.0
    interval_s: float = 0.0


class EventStreamResponse:
    """An ASGI app that streams one generation as OpenAI chunks over SSE.

    Args:
        generation: already ``start()``-ed, so that a full engine queue was a 503
            before any byte.
        header: what every chunk shares (id, created, model, ``n``, usage option).
        limits: heartbeat interval, timeouts, buffer bound, stuck timeout, pacing.
        on_end: told the end state (finished, errored or aborted) and status 200.
        live: where the stream's buffer is registered while it runs (the
            graceful drain puts its shutdown ``Fail`` there).

    A timeout or a shutdown ends the stream with one in-band error event (codes
    ``first_token_timeout``, ``request_timeout``, ``server_shutdown``), state
    ``errored``. A full buffer or a write stuck past ``stuck_timeout_s`` aborts
    the engine request and closes without an error event (the client is not
    reading it), state ``aborted``.

    Spec: OpenAI API reference, "Create chat completion", ``stream``; issue 5,
    "Slow consumers" and "Timeouts".
    """

    def __init__(
        self,
        generation: Generation,
        header: ResponseHeader,
        limits: StreamLimits,
        on_end: OnEnd,
        live: LiveStreams | None = None,
    ) -> None:
        self._generation = generation
        self._machine = StreamMachine(header)
        self._limits = limits
        self._on_end = on_end
        self._live = live if live is not None else LiveStreams()
        # The end whose last frame the client was sent: a disconnect after it
        # (a client that leaves on the error event) does not make it "aborted".
        self._sent_end: EndState | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Write the stream until it ends, errs, or the client leaves."""
        state = EndState.ABORTED
        start, send = send, scope.get(BODY_SEND, send)
        try:
            await start(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
            )
            await _send_body(send, b"".join(self._machine.start()))
            state = await self._stream(receive, send)
        except asyncio.CancelledError:
            raise
        except OSError:
            state = EndState.ABORTED  # the connection broke before the stream began
        except Exception:  # the outermost frame: log, then one error event
            logger.exception("stream %s failed", self._machine.header.id)
            state = await self._send_error(send)
        finally:
            self._generation.abort_unfinished()
            self._on_end(state, 200)
        if state is not EndState.ABORTED:
            with contextlib.suppress(OSError):  # gone after the last frame: fine
                await _send_body(send, b"", more_body=False)

    async def _stream(self, receive: Receive, send: Send) -> EndState:
        """Attach the generation to a buffer and write it; stop when told to.

        The request's own task writes. One more task watches ``receive()`` for
        the disconnect; it, the buffer's overflow, the stuck-write check and the
        deadlines stop the writer by cancelling this task with a reason (the
        ``asyncio.timeout`` pattern: ``uncancel()`` tells our cancellation from
        anyone else's, which is re-raised).
        """
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None, "an ASGI app runs in a task"
        stop = _Stop(task)
        limit = self._limits.max_buffer_bytes
        overflow = functools.partial(stop, f"over {limit} buffered bytes")
        buffer = StreamBuffer(limit, overflow)
        watcher = loop.create_task(_watch_disconnect(receive, stop))
        try:
            with _attached(self._generation, buffer, self._live, self._limits):
                return await self._write(buffer, send, stop)
        except asyncio.CancelledError:
            if stop.reason is None or task.uncancel() > 0:
                raise
        finally:
            stop.disarm()
            watcher.cancel()
        if stop.reason == _CLIENT_GONE:
            return self._sent_end or EndState.ABORTED
        logger.warning("stream %s: %s; aborted", self._machine.header.id, stop.reason)
        self._live.aborted_slow += 1
        return EndState.ABORTED

    async def _write(self, buffer: StreamBuffer, send: Send, stop: _Stop) -> EndState:
        """Drain ``buffer`` into frames until the machine ends; heartbeat on silence.

        Runs once per token per stream, so it holds no per-write timer: one
        ``_WriteWatch`` timer per stream checks for silence and stuck writes.
        Without pacing, an event that comes while this task waits with nothing
        queued is written by ``_EagerWrites`` in the producer's own callback (no
        wake-up of this task per token); this task takes over whatever that
        cannot finish at once.
        """
        machine = self._machine
        limits = self._limits
        stuck = functools.partial(
            stop, f"the client accepted no byte for {limits.stuck_timeout_s:g} s"
        )
        watch = _WriteWatch(limits, buffer.poke, stuck)
        eager = None
        if limits.interval_s <= 0:
            eager = _EagerWrites(machine, send, watch, buffer.poke, self._end_sent)
            buffer.direct = eager
        try:
            while True:
                await buffer.wait()
                if eager is not None and not await eager.settle():
                    return EndState.ABORTED
                ended = machine.end_state
                if ended is not None:  # its last frames went out eagerly
                    return ended
                events = buffer.drain()
                if not events:
                    if not watch.silent:
                        continue  # a poke that came early
                    events = [_HEARTBEAT]
                frames = self._frames(events)
                if frames:
                    watch.writing()
                    body = b"".join(frames)
                    try:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": body,
                                "more_body": True,
                            }
                        )
                    except OSError:  # the connection broke: the client is gone
                        return EndState.ABORTED
                    watch.wrote()
                    self._sent_end = machine.end_state
                    if events[0] is _HEARTBEAT:
                        self._live.heartbeats_sent += 1
                    elif limits.interval_s > 0 and machine.end_state is None:
                        await asyncio.sleep(limits.interval_s)  # what comes coalesces
                if machine.end_state is not None:
                    return machine.end_state
        finally:
            buffer.direct = None
            watch.cancel()
            if eager is not None:
                eager.close()

    def _end_sent(self, state: EndState) -> None:
        self._sent_end = state

    def _frames(self, events: list[StreamEvent]) -> list[bytes]:
        machine = self._machine
        if len(events) == 1:
            return machine.feed(events[0])
        frames: list[bytes] = []
        for event in events:
            frames += machine.feed(event)
            if machine.end_state is not None:
                break
        return frames

    async def _send_error(self, send: Send) -> EndState:
        # The details stay in the log: they may be internal.
        fail = Fail(
            "The server failed while streaming this response", code="internal_error"
        )
        try:
            frames = self._machine.feed(fail)
        except LocalProtocolError:
            # The machine had ended: the end is what the client was sent, if its
            # last frames went out; else it saw neither [DONE] nor an error.
            return self._sent_end or EndState.ERRORED
        try:
            await _send_body(send, b"".join(frames))
        except OSError:
            return EndState.ABORTED
        return EndState.ERRORED


_HEARTBEAT = Heartbeat()

_CLOCK_SLACK_S = 0.001
"""uvloop's clock counts whole milliseconds: a timer due at t may read t - 1 ms
when it fires. Comparisons allow that much, and no timer is armed in the past
(it would fire again at once until the clock ticks)."""


class _WriteWatch:
    """One stream's heartbeat and stuck-write timer: one loop timer, re-armed.

    The writer calls ``writing()`` before each write and ``wrote()`` after it (two
    clock reads, no timer per write). The timer pokes the writer when nothing was
    written for ``heartbeat_interval_s``, and calls ``on_stuck`` when a write has
    waited for the client for ``stuck_timeout_s``; it checks at least every
    quarter of ``stuck_timeout_s``, so a stuck write is caught within 1.25 x that
    limit.
    """

    __slots__ = (
        "_heartbeat_s",
        "_loop",
        "_on_stuck",
        "_poke",
        "_stuck_s",
        "_timer",
        "last_write",
        "write_started",
    )

    def __init__(
        self,
        limits: StreamLimits,
        poke: Callable[[], None],
        on_stuck: Callable[[], None],
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._heartbeat_s = limits.heartbeat_interval_s
        self._stuck_s = limits.stuck_timeout_s
        self._poke = poke
        self._on_stuck = on_stuck
        self.last_write = self._loop.time()
        self.write_started: float | None = None
        self._timer = self._loop.call_at(self._due(self.last_write), self._check)

    @property
    def silent(self) -> bool:
        """Whether nothing was written for ``heartbeat_interval_s``."""
        return self._loop.time() - self.last_write >= self._heartbeat_s - _CLOCK_SLACK_S

    def writing(self) -> None:
        """A write starts now."""
        self.write_started = self._loop.time()

    def wrote(self) -> None:
        """The write ended: the client accepted the bytes."""
        self.last_write = self._loop.time()
        self.write_started = None

    def cancel(self) -> None:
        """Stop the timer (the stream ended)."""
        self._timer.cancel()

    def _due(self, now: float) -> float:
        if self.write_started is not None:
            due = self.write_started + self._stuck_s
        else:
            due = min(self.last_write + self._heartbeat_s, now + self._stuck_s / 4)
        return max(due, now + _CLOCK_SLACK_S)  # never in the past: no spinning

    def _check(self) -> None:
        now = self._loop.time()
        started = self.write_started
        if started is not None and now - started >= self._stuck_s:
            self._on_stuck()
            return
        if (
            started is None
            and now - self.last_write >= self._heartbeat_s - _CLOCK_SLACK_S
        ):
            self._poke()
            # The heartbeat's own write may get stuck: check it in time.
            due = now + min(self._heartbeat_s, self._stuck_s / 4)
        else:
            due = self._due(now)
        self._timer = self._loop.call_at(due, self._check)


class _EagerWrites:
    """Writes a stream's events from the producer's callback while its task waits.

    ``StreamBuffer.direct``: called with an event when the stream's task waits
    with nothing queued. The event goes through the ``StreamMachine`` and the
    ASGI ``send`` coroutine is driven by hand (``send(None)``). A server's
    ``send`` finishes without suspending unless the socket is behind
    (uvicorn: its write buffer is over the high-water mark); then the started
    coroutine is handed to the task, which finishes it in ``settle()`` before
    anything else is written. A failure (the socket broke, a bug) is kept for
    the task too, and so is the machine's end: the task is poked in each case,
    so nothing here raises into the producer.

    This is the work the task would do per token, minus waking it: a future,
    a loop callback and a task step per token per stream (the same idea as
    Python 3.12's eager tasks, for one call). Every step of a hand-driven
    ``send`` runs in one copy of the task's context, taken here: a wrapper
    around ``send`` that sets and resets a context variable (tracing does) sees
    its own request's values, and resets in the context it set in, even when
    the task finishes the write. What it cannot have is a current task: a
    ``send`` that needs one (an anyio cancel scope around it) fails its stream
    with ``internal_error``; pacing (``interval_s > 0``) writes from the task
    only. uvicorn's ``send`` needs none.
    """

    __slots__ = (
        "_context",
        "_end_sent",
        "_machine",
        "_poke",
        "_send",
        "_time",
        "_watch",
        "failure",
        "pending",
    )

    def __init__(
        self,
        machine: StreamMachine,
        send: Send,
        watch: _WriteWatch,
        poke: Callable[[], None],
        end_sent: Callable[[EndState], None],
    ) -> None:
        self._machine = machine
        self._send = send
        self._watch = watch
        self._poke = poke
        self._end_sent = end_sent  # told when the machine's last frames went out
        self._context = contextvars.copy_context()
        self._time = asyncio.get_running_loop().time
        self.pending: _Resume | None = None
        self.failure: Exception | asyncio.CancelledError | None = None

    def __call__(self, event: StreamEvent) -> None:
        machine = self._machine
        try:
            frames = machine.feed(event)
            if frames:
                body = frames[0] if len(frames) == 1 else b"".join(frames)
                sending = self._send(
                    {"type": "http.response.body", "body": body, "more_body": True}
                )
                steps: _Steps = (
                    sending  # a coroutine has send() and throw() itself
                    if isinstance(sending, CoroutineType)
                    else sending.__await__()
                )
                try:
                    waiting_on = self._context.run(steps.send, None)
                except StopIteration:
                    # _watch.wrote(), inline: no write of the task is in
                    # flight while it waits, so write_started is None already.
                    self._watch.last_write = self._time()
                else:  # the socket is behind: the task finishes this write
                    self._watch.writing()
                    self.pending = _Resume(steps, waiting_on, self._context)
                    self._poke()
                    return
        except (Exception, asyncio.CancelledError) as exc:  # the task raises it
            self.failure = exc
            self._poke()
            return
        if type(event) is not Delta:  # only an End or a Fail ends the machine
            ended = machine.end_state
            if ended is not None:
                self._end_sent(ended)  # its last frames went out
                self._poke()

    async def settle(self) -> bool:
        """In the task: finish a handed-over write, raise a kept failure.

        Returns False when the connection broke (the client is gone).

        Raises:
            Exception: a bug met in ``__call__``, re-raised here (so is a
                ``CancelledError`` that ``send`` raised there).
        """
        pending, self.pending = self.pending, None
        if pending is not None:
            try:
                await pending
            except OSError:
                return False
            self._watch.wrote()  # an end it wrote: the writer returns it next
        failure, self.failure = self.failure, None
        if isinstance(failure, OSError):
            return False
        if failure is not None:
            raise failure
        return True

    def close(self) -> None:
        """Drop a handed-over write the task did not finish (it was stopped)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.close()


_Steps = Coroutine[Any, Any, Any] | Generator[Any, Any, Any]
"""An awaitable's steps: a coroutine, or what ``__await__()`` returns."""


class _Resume:
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
        steps: _Steps,
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


_CLIENT_GONE = "the client disconnected"


class _Stop:
    """Stops a response's task once, for a reason (see ``EventStreamResponse``).

    ``disarm()`` before the task leaves the code that handles the cancellation:
    a later call is then ignored instead of cancelling whatever the task does
    next.
    """

    __slots__ = ("_task", "reason")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task: asyncio.Task[Any] | None = task
        self.reason: str | None = None

    def __call__(self, reason: str) -> None:
        if self.reason is None and self._task is not None:
            self.reason = reason
            self._task.cancel()

    def disarm(self) -> None:
        """Ignore every later call."""
        self._task = None


async def _watch_disconnect(receive: Receive, stop: Callable[[str], None]) -> None:
    """Call ``stop(_CLIENT_GONE)`` when the client disconnects."""
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            stop(_CLIENT_GONE)
            return


@contextlib.contextmanager
def _attached(
    generation: Generation,
    buffer: StreamBuffer,
    live: LiveStreams,
    limits: StreamLimits,
) -> Iterator[None]:
    """For the body: ``buffer`` registered in ``live`` (the graceful drain puts
    its ``Fail`` there), the deadlines of ``limits`` armed on it, and
    ``generation`` attached to it; all undone after, whatever ends the body."""
    live.open(buffer)
    deadlines = _arm_deadlines(generation, buffer, limits)
    try:
        generation.attach(buffer)
        yield
    finally:
        for timer in deadlines:
            timer.cancel()
        generation.detach()
        live.close(buffer)


def _arm_deadlines(
    generation: Generation, outbox: Outbox, limits: StreamLimits
) -> list[asyncio.TimerHandle]:
    """Timers that put a timeout ``Fail`` into ``outbox`` when a limit runs out."""
    loop = asyncio.get_running_loop()
    first, total = limits.first_token_timeout_s, limits.request_timeout_s
    timers = []

    def first_token_due() -> None:
        if generation.first_token_at is None:
            message = f"No token was generated within {first:g} s"
            outbox.put(Fail(message, code=FIRST_TOKEN_TIMEOUT))

    def request_due() -> None:
        message = f"The request did not complete within {total:g} s"
        outbox.put(Fail(message, code=REQUEST_TIMEOUT))

    if first is not None and (total is None or first < total):
        timers.append(loop.call_later(first, first_token_due))
    if total is not None:
        timers.append(loop.call_later(total, request_due))
    return timers


class CompletionResponse:
    """An ASGI app that waits for the whole generation and sends one JSON body.

    The client's disconnect is watched while waiting: it aborts the engine,
    nothing is sent, and ``on_end`` gets ``CLIENT_CLOSED``. An engine failure
    (nothing sent yet) becomes a 503 for ``EngineUnavailable``, else a 500, in the
    OpenAI error shape.

    Args:
        generation: already ``start()``-ed.
        header: id, created, model and endpoint of the response.
        on_end: told the end state (finished, errored or aborted) and the status.

    Spec: OpenAI API reference, "The chat completion object", "The completion
    object".
    """

    def __init__(
        self,
        generation: Generation,
        header: ResponseHeader,
        on_end: OnEnd,
        limits: StreamLimits | None = None,
        live: LiveStreams | None = None,
    ) -> None:
        self._generation = generation
        self._header = header
        self._on_end = on_end
        self._limits = limits or StreamLimits()
        self._live = live if live is not None else LiveStreams()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Generate, then send ``chat.completion``/``text_completion`` JSON."""
        # Until set below: a bug escaped, and Starlette answers 500.
        state, status = EndState.ERRORED, 500
        try:
            result = await _race_disconnect(receive, self._collect)
            if isinstance(result, _Gone):
                state, status = EndState.ABORTED, CLIENT_CLOSED
                return
            collected, fail = result
            if fail is None:
                state, status, body = EndState.FINISHED, 200, self._payload(collected)
            else:
                state, status = EndState.ERRORED, _status_of(fail)
                body = error_payload(fail.message, fail.type, None, fail.code)
            await _send_json(send, status, body)
        except OSError:
            state = EndState.ABORTED  # the status went out (or not); the body did not
        finally:
            self._generation.abort_unfinished()
            self._on_end(state, status)

    async def _collect(self) -> tuple[_Collected, Fail | None]:
        collected = _Collected(self._header.n)
        end: End | Fail | None = None
        # Text is kept until the end anyway: the buffer needs no byte bound.
        outbox = StreamBuffer(2**62)
        with _attached(self._generation, outbox, self._live, self._limits):
            while end is None:
                await outbox.wait()
                for event in outbox.drain():
                    if isinstance(event, Delta):
                        collected.add(event)
                    elif isinstance(event, End | Fail):
                        end = event
                        break
        return collected, end if isinstance(end, Fail) else None

    def _payload(self, collected: _Collected) -> dict[str, Any]:
        texts = ["".join(parts) for parts in collected.texts]
        choices = list(zip(texts, self._generation.finish_reasons, strict=True))
        usage = self._generation.usage
        logprobs = (
            tuple(tuple(tokens) for tokens in collected.logprobs)
            if self._generation.wants_logprobs
            else (None,) * self._header.n
        )
        if self._header.endpoint is Endpoint.CHAT:
            return chat_completion(self._header, choices, usage, logprobs)
        return text_completion(self._header, choices, usage, logprobs)


class _Collected:
    """The deltas of a non-streamed response, per choice: text parts, logprobs."""

    def __init__(self, n: int) -> None:
        self.texts: list[list[str]] = [[] for _ in range(n)]
        self.logprobs: list[list[LogprobToken]] = [[] for _ in range(n)]

    def add(self, delta: Delta) -> None:
        self.texts[delta.index].append(delta.text)
        if delta.logprobs:
            self.logprobs[delta.index].extend(delta.logprobs)


_STATUS_OF_CODE = {
    EngineUnavailable.code: 503,
    SERVER_SHUTDOWN: 503,
    FIRST_TOKEN_TIMEOUT: 504,
    REQUEST_TIMEOUT: 504,
}


def _status_of(fail: Fail) -> int:
    return _STATUS_OF_CODE.get(fail.code or "", 500)


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = dumps(payload)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await _send_body(send, body, more_body=False)
