"""The ASGI app that streams a resumable response's log to one reader.

``LogStreamResponse`` is what the first ``POST`` of a resumable stream answers
with, and what each resume (``GET .../events``) answers with: the log's frames
after a cursor, each with an ``id:`` line naming its cursor, then the live ones
as the producer appends them, until the log's last frame. The producer
(``resumable_producer.py``) writes into the store and never waits on a reader.

A store that pushes (``PushRead``) hands the live frames to the response's
eager write, from the producer's call while the reader's task waits:
the write is started there and, when ``send`` finishes without suspending (a
socket that keeps up), the task is never woken for that frame, as
``writers.EagerWriter`` does for a live stream. A ``send`` that suspends is
finished by a task of its own; while it (or a heartbeat) is in flight, or
before the response follows the log, the eager write refuses frames and the
reader's task writes them after it.

Invariants:
    - The checks (unknown id, another key's log, an evicted cursor) were made
      before this app runs: its first batch is already read (the store yields it
      at once), so the status is always 200.
    - Each frame goes out as ``id: <response_id>.<seq>`` then the frame's own
      bytes; ``: keep-alive`` comment lines (no ``id:``) go out after
      ``heartbeat_interval_s`` of silence; writes never interleave.
    - A reader that leaves, or whose write waits more than ``stuck_timeout_s``
      (it cannot keep up), or that falls behind the log's bound
      (``CursorEvicted`` mid-stream), or whose pushed write meets a broken
      connection (``BROKEN``), is cut: the body ends without a terminator and
      the client may resume from the last ``id:`` it saw.
    - No frame is pushed to a reader whose task is being cancelled (its client
      left): a write started then could never be finished.
    - When the producer's replica dies (``ProducerLost``, a shared store only),
      the reader writes one in-band error event (``producer_lost``), then ends.
    - When the shared store fails under the reader (Redis killed, restarted
      or full: any other ``StoreError``), the reader writes one in-band error
      event (``resume_store_unavailable``, ``resume_store_full`` when full;
      no ``id:``, no ``[DONE]``), then ends its body cleanly.
    - Pushed or not, each frame is written once, in sequence order; a failure of
      a pushed write other than a broken connection is raised by the reader's
      task at its next batch or at the log's end.

Deliberate divergence: a heartbeat is the line ``: keep-alive`` with no blank
line after it (the live path sends a blank line too): the openai SDK, once it
has seen an ``id``, dispatches an empty event at every blank line and fails on
it; to WHATWG, and to ``core.sse``, a comment line is a comment line either way.

Spec: WHATWG HTML, "9.2 Server-sent events" (``id`` field, ``Last-Event-ID``);
docs/resumable-streams.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
from collections.abc import AsyncIterator, Callable
from types import CoroutineType

from starlette.types import Receive, Scope, Send

from sluicegate.core.chunks import dumps, error_payload
from sluicegate.core.sse import encode_comment
from sluicegate.server.disconnect import DisconnectRace
from sluicegate.server.event_store import (
    STORE_LOST,
    CursorEvicted,
    EventStore,
    Frames,
    ProducerLost,
    StoreError,
    store_error_code,
)
from sluicegate.server.sse_response import BODY_SEND, SSE_HEADERS
from sluicegate.server.streaming import StreamLimits
from sluicegate.server.write_watch import WriteWatch
from sluicegate.server.writers import Resume, Steps

__all__ = ["BROKEN", "PRODUCER_LOST", "LogStreamResponse"]

logger = logging.getLogger(__name__)

PRODUCER_LOST = "producer_lost"
"""Error code of the in-band error a reader writes when the producer died."""

BROKEN = "the connection broke"
"""``LogStreamResponse.cut`` when a write of a pushed frame met a broken socket."""

# A comment line without the blank line after it: an event stream with ids makes
# the openai SDK dispatch an empty event at every blank line (it keeps the last
# id), which it then fails to parse; WHATWG ignores a comment line either way.
_KEEP_ALIVE = encode_comment("keep-alive").rstrip(b"\n") + b"\n"


class LogStreamResponse:
    """An ASGI app: a resumable response's log from a cursor, then its live tail.

    Made by ``open`` (which reads the first batch: the checks), or from a
    batch already read.

    Args:
        response_id: the response whose log is read.
        first: the first batch of ``batches``, already read (checks passed).
        batches: the rest of the store's ``read``.
        limits: ``heartbeat_interval_s`` and ``stuck_timeout_s`` are used.
    """

    def __init__(
        self,
        response_id: str,
        first: Frames,
        batches: AsyncIterator[Frames],
        limits: StreamLimits,
    ) -> None:
        self.response_id = response_id
        """The response whose log is read."""
        self._prefix = response_id.encode()
        self._first = first
        self._batches = batches
        self._limits = limits
        self._sending = False  # a write is in flight (the task's or a heartbeat's)
        self._beat: asyncio.Task[None] | None = None  # a heartbeat's or pushed write
        self._failure: BaseException | None = None  # met by a pushed write
        # What a write from outside the reader's task needs (a pushed frame, a
        # heartbeat), set while the response follows the log: the body's
        # send, its watch, its race, the reader's task and context.
        self._pushing: (
            tuple[
                Send,
                WriteWatch,
                DisconnectRace,
                asyncio.Task[object],
                contextvars.Context,
            ]
            | None
        ) = None
        self.cut: str | None = None
        """Why the reader was cut (``None``: it read to the end)."""
        self.past_end = False
        """Set by ``open`` when the log had ended with no frame after the
        cursor: this reader would get an empty body."""
        self.answered: Callable[[int], None] | None = None
        """Set on the first reader of a whole plan (``Plan.whole``): report the
        HTTP status its client was answered, which the response's ledger row
        waits for (``CLIENT_CLOSED`` when nothing was sent)."""

    @classmethod
    async def open(
        cls,
        store: EventStore,
        response_id: str,
        owner: str,
        after: int,
        limits: StreamLimits,
        *,
        pushed: bool = True,
    ) -> LogStreamResponse:
        """A reader of ``owner``'s log of ``response_id`` after ``after``, its
        first batch read: with ``read_pushed`` (this response's eager write as
        its push) when the store has it and ``pushed`` asks for it.

        Raises:
            LogNotFound: no such log for ``owner``.
            CursorEvicted: frame ``after + 1`` is no longer kept.
        """
        empty: Frames = []
        response = cls(response_id, empty, _no_batches(), limits)
        read_pushed = getattr(store, "read_pushed", None) if pushed else None
        if read_pushed is None:
            batches = store.read(response_id, owner, after)
        else:
            batches = read_pushed(response_id, owner, after, response._pushed)
        response._batches = batches
        try:
            response._first = await anext(batches)
        except StopAsyncIteration:  # a finished log, nothing after the cursor
            response.past_end = True
        return response

    async def frames(self) -> AsyncIterator[bytes]:
        """The log's frames (without ``id:`` lines), read here rather than sent;
        the log is closed when the iteration ends or is closed."""
        try:
            for _, frame in self._first:
                yield frame
            async for batch in self._batches:
                for _, frame in batch:
                    yield frame
        finally:
            await _close(self._batches)

    async def aclose(self) -> None:
        """Stop reading without sending anything (the reader detaches)."""
        await _close(self._batches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Send the status, then the frames, until the log ends or the reader is cut."""
        start, send = send, scope.get(BODY_SEND, send)
        try:
            await start(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
            )
            ended = await self._follow(receive, send)
        except OSError:
            ended = False  # the connection broke
        finally:
            await _close(self._batches)
        if ended:
            with contextlib.suppress(OSError):
                await _body(send, b"", more_body=False)

    async def _follow(self, receive: Receive, send: Send) -> bool:
        """Write every batch; True when the log ended, False when cut."""
        limits = self._limits
        with DisconnectRace(receive) as race:
            stuck = functools.partial(
                race.stop, f"no byte accepted for {limits.stuck_timeout_s:g} s"
            )

            watch = WriteWatch(
                limits.heartbeat_interval_s,
                limits.stuck_timeout_s,
                self._heartbeat_due,
                stuck,
            )
            task = asyncio.current_task()
            assert task is not None  # DisconnectRace made sure of it
            self._pushing = (send, watch, race, task, contextvars.copy_context())
            try:
                await self._write(self._first, send, watch)
                async for batch in self._batches:  # once per token: kept flat
                    if self._beat is not None:
                        await self._beat
                    if self._failure is not None:
                        self._raise_failure()
                    prefix = self._prefix
                    if len(batch) == 1:
                        seq, frame = batch[0]
                        body = b"id: %s.%d\n%s" % (prefix, seq, frame)
                    else:
                        body = b"".join(
                            b"id: %s.%d\n%s" % (prefix, seq, f) for seq, f in batch
                        )
                    self._sending = True
                    watch.writing()
                    await send(
                        {"type": "http.response.body", "body": body, "more_body": True}
                    )
                    watch.wrote()
                    self._sending = False
                if self._beat is not None:  # a pushed write ends the log
                    await self._beat
                self._raise_failure()
            except CursorEvicted:
                self.cut = "fell behind the log's bound"
                if self._beat is not None:  # a write in flight goes out first
                    await self._beat
                return False
            except ProducerLost:
                payload = error_payload(
                    "The server producing this stream stopped",
                    "server_error",
                    None,
                    PRODUCER_LOST,
                )
                await self._send(send, b"data: " + dumps(payload) + b"\n\n", watch)
                return True
            except StoreError as exc:  # the shared store failed: gone, or full
                logger.warning("reader of %s ended: %s", self.response_id, exc)
                code = store_error_code(exc)
                payload = error_payload(STORE_LOST, "server_error", None, code)
                await self._send(send, b"data: " + dumps(payload) + b"\n\n", watch)
                return True
            finally:
                self._pushing = None
                watch.cancel()
                if self._beat is not None:
                    self._beat.cancel()
                # No cycle outlives the response: _pushing holds the watch,
                # which holds _heartbeat_due, and a pushed write's failure not
                # raised (the reader was cut) a traceback that holds this
                # response.
                self._failure = None
        if race.reason is not None:
            self.cut = race.reason
            return False
        return True

    def _pushed(self, batch: Frames) -> bool:
        """The ``push`` of ``read_pushed``: write ``batch`` now, from the
        store's call, unless the response does not follow the log (yet, or
        any more), a write is in flight or one failed (then the reader's task
        takes it), or the reader's task is being cancelled (its client left:
        the frame is not written at all). A ``send`` that suspends is finished
        by a task of its own. Once per token: kept flat."""
        pushing = self._pushing
        if (
            pushing is None
            or self._sending
            or self._beat is not None
            or self._failure is not None
        ):
            return False
        send, watch, race, task, context = pushing
        if task.cancelling():
            return False
        prefix = self._prefix
        if len(batch) == 1:
            seq, frame = batch[0]
            body = b"id: %s.%d\n%s" % (prefix, seq, frame)
        else:
            body = b"".join(b"id: %s.%d\n%s" % (prefix, seq, f) for seq, f in batch)
        try:
            sending = send(
                {"type": "http.response.body", "body": body, "more_body": True}
            )
            steps: Steps = (
                sending if isinstance(sending, CoroutineType) else sending.__await__()
            )
            waiting_on = context.run(steps.send, None)
        except StopIteration:
            watch.last_write = watch.clock.time()  # no write was in flight
            return True
        except (Exception, asyncio.CancelledError) as exc:  # the task raises it
            self._failure = exc
            return False
        self._sending = True
        watch.writing()
        pending = Resume(steps, waiting_on, context)
        self._beat = asyncio.get_running_loop().create_task(
            self._finish(pending, watch, race)
        )
        return True

    async def _finish(
        self, pending: Resume, watch: WriteWatch, race: DisconnectRace
    ) -> None:
        """Finish a pushed write that suspended. A broken connection stops the
        reader at once (its task may wait on the store for a long time); any
        other failure is kept for the reader's task to raise."""
        try:
            await pending
            watch.wrote()
        except OSError:
            race.stop(BROKEN)
        except Exception as exc:  # the reader's task raises it
            self._failure = exc
        finally:
            self._sending = False
            self._beat = None

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    async def _write(self, batch: Frames, send: Send, watch: WriteWatch) -> None:
        if not batch:
            return
        prefix = self._prefix
        body = b"".join(b"id: %s.%d\n%s" % (prefix, seq, f) for seq, f in batch)
        await self._send(send, body, watch)

    async def _send(self, send: Send, body: bytes, watch: WriteWatch) -> None:
        if self._beat is not None:  # a heartbeat is in flight: after it
            await self._beat
        self._sending = True
        watch.writing()
        await _body(send, body)
        watch.wrote()
        self._sending = False

    def _heartbeat_due(self) -> None:
        """``WriteWatch``'s poke on silence, while the response follows the log."""
        pushing = self._pushing
        if pushing is not None:
            self._start_heartbeat(pushing[0], pushing[1])

    def _start_heartbeat(self, send: Send, watch: WriteWatch) -> None:
        """``WriteWatch``'s poke on silence: one ``: keep-alive``, in a task of
        its own (the reader's task waits on the store), unless a write is in
        flight; the reader's next write waits for it."""
        if self._sending or self._beat is not None:
            return
        loop = asyncio.get_running_loop()
        self._beat = loop.create_task(self._heartbeat(send, watch))

    async def _heartbeat(self, send: Send, watch: WriteWatch) -> None:
        try:
            with contextlib.suppress(OSError):  # the reader's own write sees it
                await self._send_now(send, _KEEP_ALIVE, watch)
        finally:
            self._beat = None

    async def _send_now(self, send: Send, body: bytes, watch: WriteWatch) -> None:
        self._sending = True
        watch.writing()
        try:
            await _body(send, body)
        finally:
            self._sending = False
        watch.wrote()


async def _no_batches() -> AsyncIterator[Frames]:
    """What ``open`` holds until the store's read is made."""
    none: tuple[Frames, ...] = ()
    for batch in none:
        yield batch


async def _close(batches: AsyncIterator[Frames]) -> None:
    aclose = getattr(batches, "aclose", None)
    if aclose is not None:
        await aclose()


async def _body(send: Send, body: bytes, *, more_body: bool = True) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more_body})
