"""The ASGI app that streams a resumable response's log to one reader.

``LogStreamResponse`` is what the first ``POST`` of a resumable stream answers
with, and what each resume (``GET .../events``) answers with: the log's frames
after a cursor, each with an ``id:`` line naming its cursor, then the live ones
as the producer appends them, until the log's last frame. The producer
(``producer.py``) writes into the store and never waits on a reader.

The reader's task pumps the log's frames (``LogFrames``, ``log_writes.py``)
through a ``FrameSink`` to the connection (``streaming/pump.py``), as every stream is
written; a store that pushes (``PushRead``) hands the live frames to the
sink from the producer's call, while the reader's task waits.

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
      connection (``log_writes.BROKEN``), is cut: the body ends without a terminator and
      the client may resume from the last ``id:`` it saw.
    - When the producer's replica dies (``ProducerLost``, a shared store only),
      the reader writes one in-band error event (``producer_lost``), then ends.
    - When the shared store fails under the reader (Redis killed, restarted
      or full: any other ``StoreError``), the reader writes one in-band error
      event (``resume_store_unavailable``, ``resume_store_full`` when full;
      no ``id:``, no ``[DONE]``), then ends its body cleanly.
    - Pushed or not, each frame is written once, in sequence order; a failure of
      a pushed write other than a broken connection is raised by the reader's
      task at its next batch or at the log's end.

Heartbeats are ``: keep-alive`` lines without a blank line after them
(``log_writes.py`` says why).

Spec: WHATWG HTML, "9.2 Server-sent events" (``id`` field, ``Last-Event-ID``);
docs/resumable-streams.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from starlette.types import Receive, Scope, Send

from sluicegate.core.wire.chunks import dumps, error_payload
from sluicegate.server.http.errors import (
    STORE_LOST,
    CursorEvicted,
    ProducerLost,
    StoreError,
    store_error_code,
)
from sluicegate.server.resumable.log_writes import BROKEN, LogFrames
from sluicegate.server.stores.event_store import EventStore, Frames
from sluicegate.server.streaming.disconnect import DisconnectRace
from sluicegate.server.streaming.pump import pump
from sluicegate.server.streaming.shared import StreamLimits
from sluicegate.server.streaming.sink import FrameSink, body_writes, body_writes_now
from sluicegate.server.streaming.sse_response import BODY_SEND, SSE_HEADERS
from sluicegate.server.streaming.write_watch import WriteWatch

__all__ = ["PRODUCER_LOST", "LogStreamResponse"]

logger = logging.getLogger(__name__)

PRODUCER_LOST = "producer_lost"
"""Error code of the in-band error a reader writes when the producer died."""


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
        batches: AsyncGenerator[Frames, None],
        limits: StreamLimits,
    ) -> None:
        self.response_id = response_id
        """The response whose log is read."""
        self._first = first
        self._batches = batches
        self._limits = limits
        self._source = LogFrames(response_id)
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
        push_read = store.capabilities.push_read if pushed else None
        if push_read is None:
            batches = store.read(response_id, owner, after)
        else:
            push = response._source.push
            batches = push_read.read_pushed(response_id, owner, after, push)
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
                await send(
                    {"type": "http.response.body", "body": b"", "more_body": False}
                )

    async def _follow(self, receive: Receive, send: Send) -> bool:
        """Pump every batch to ``send``; True when the log ended, False when cut."""
        limits, source = self._limits, self._source
        clock = limits.clock or asyncio.get_running_loop()
        with DisconnectRace(receive) as race:
            stuck = functools.partial(
                race.stop, f"no byte accepted for {limits.stuck_timeout_s:g} s"
            )
            watch = WriteWatch(
                limits.heartbeat_interval_s,
                limits.stuck_timeout_s,
                source.heartbeat_due,
                stuck,
                clock,
            )
            broken = functools.partial(race.stop, BROKEN)
            sink = FrameSink(
                body_writes(send), watch, on_broken=broken, now=body_writes_now(send)
            )
            source.follow(self._first, self._batches, sink)
            try:
                if not await pump(source, sink):
                    return False  # the connection broke
            except CursorEvicted:
                self.cut = "fell behind the log's bound"
                await sink.flushed()  # a write in flight goes out first
                return False
            except ProducerLost:
                payload = error_payload(
                    "The server producing this stream stopped",
                    "server_error",
                    None,
                    PRODUCER_LOST,
                )
                return await _last(sink, payload)
            except StoreError as exc:  # the shared store failed: gone, or full
                logger.warning("reader of %s ended: %s", self.response_id, exc)
                code = store_error_code(exc)
                payload = error_payload(STORE_LOST, "server_error", None, code)
                return await _last(sink, payload)
            finally:
                # No cycle outlives the response: the sink holds the watch,
                # which holds heartbeat_due, and a pushed write's failure not
                # raised (the reader was cut) a traceback that holds this
                # response.
                source.unfollow()
                sink.close()
                watch.cancel()
        if race.reason is not None:
            self.cut = race.reason
            return False
        return True


async def _last(sink: FrameSink, payload: dict[str, object]) -> bool:
    """Write one in-band error event (no ``id:``): the reader's last."""
    return await sink.write([b"data: " + dumps(payload) + b"\n\n"])


async def _no_batches() -> AsyncGenerator[Frames, None]:
    """What ``open`` holds until the store's read is made."""
    none: tuple[Frames, ...] = ()
    for batch in none:
        yield batch


async def _close(batches: AsyncGenerator[Frames, None]) -> None:
    await batches.aclose()
