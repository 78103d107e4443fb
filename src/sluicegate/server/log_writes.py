"""The writes of one log reader's body: its own, pushed ones, and heartbeats.

``LogStreamResponse`` (``log_response.py``) follows a log from its own task; a
store that pushes (``PushRead``) hands it live frames from the producer's call
instead (``LogWrites.push``): the write is started there and, when ``send``
finishes without suspending (a socket that keeps up), the reader's task is never
woken for that frame, as ``writers.EagerWriter`` does for a live stream. A
``send`` that suspends is finished by a task of its own; while it (or a
heartbeat) is in flight, or before the response follows the log, ``push``
refuses frames and the reader's task writes them after it.

Invariants:
    - Writes never interleave: at most one is in flight (``sending``), and a
      heartbeat's or pushed write's task (``beat``) is awaited before the next.
    - No frame is pushed to a reader whose task is being cancelled (its client
      left): a write started then could never be finished.
    - A pushed write that meets a broken connection stops the reader at once
      (``BROKEN``); any other failure is kept (``failure``) for the reader's task
      to raise at its next batch or at the log's end.

Deliberate divergence: a heartbeat is the line ``: keep-alive`` with no blank
line after it (the live path sends a blank line too): the openai SDK, once it
has seen an ``id``, dispatches an empty event at every blank line and fails on
it; to WHATWG, and to ``core.sse``, a comment line is a comment line either way.

Spec: WHATWG HTML, "9.2 Server-sent events" (``id`` field); ASGI, "HTTP".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from types import CoroutineType

from starlette.types import Send

from sluicegate.core.sse import encode_comment
from sluicegate.server.disconnect import DisconnectRace
from sluicegate.server.event_store import Frames
from sluicegate.server.write_watch import WriteWatch
from sluicegate.server.writers import Resume, Steps

__all__ = ["BROKEN", "LogWrites", "body_part"]

BROKEN = "the connection broke"
"""``LogStreamResponse.cut`` when a write of a pushed frame met a broken socket."""

# A comment line without the blank line after it: an event stream with ids makes
# the openai SDK dispatch an empty event at every blank line (it keeps the last
# id), which it then fails to parse; WHATWG ignores a comment line either way.
_KEEP_ALIVE = encode_comment("keep-alive").rstrip(b"\n") + b"\n"


class LogWrites:
    """The writes of one reader of the log of ``response_id`` (see the module doc).

    Attributes:
        prefix: the response id, encoded: each frame's ``id:`` line names it.
        sending: a write is in flight (the reader task's or a heartbeat's).
        beat: the task of a heartbeat or a pushed write in flight, or ``None``.
        failure: what a pushed write met, for the reader's task to raise.
        pushing: what a write from outside the reader's task needs, set while
            the response follows the log: the body's send, its watch, its race,
            the reader's task and its context.
    """

    __slots__ = ("beat", "failure", "prefix", "pushing", "sending")

    def __init__(self, response_id: str) -> None:
        self.prefix = response_id.encode()
        self.sending = False
        self.beat: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None
        self.pushing: (
            tuple[
                Send,
                WriteWatch,
                DisconnectRace,
                asyncio.Task[object],
                contextvars.Context,
            ]
            | None
        ) = None

    def push(self, batch: Frames) -> bool:
        """The ``push`` of ``read_pushed``: write ``batch`` now, from the
        store's call, unless the response does not follow the log (yet, or
        any more), a write is in flight or one failed (then the reader's task
        takes it), or the reader's task is being cancelled (its client left:
        the frame is not written at all). A ``send`` that suspends is finished
        by a task of its own. Once per token: kept flat."""
        pushing = self.pushing
        if (
            pushing is None
            or self.sending
            or self.beat is not None
            or self.failure is not None
        ):
            return False
        send, watch, race, task, context = pushing
        if task.cancelling():
            return False
        prefix = self.prefix
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
            self.failure = exc
            return False
        self.sending = True
        watch.writing()
        pending = Resume(steps, waiting_on, context)
        self.beat = asyncio.get_running_loop().create_task(
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
            self.failure = exc
        finally:
            self.sending = False
            self.beat = None

    def raise_failure(self) -> None:
        """Raise what a pushed write met, once (nothing when it met nothing)."""
        failure, self.failure = self.failure, None
        if failure is not None:
            raise failure

    async def write(self, batch: Frames, send: Send, watch: WriteWatch) -> None:
        """Write ``batch``'s frames, each after its ``id:`` line, in one part."""
        if not batch:
            return
        prefix = self.prefix
        body = b"".join(b"id: %s.%d\n%s" % (prefix, seq, f) for seq, f in batch)
        await self.send(send, body, watch)

    async def send(self, send: Send, body: bytes, watch: WriteWatch) -> None:
        """Write ``body`` from the reader's task, after a write in flight."""
        if self.beat is not None:  # a heartbeat is in flight: after it
            await self.beat
        self.sending = True
        watch.writing()
        await body_part(send, body)
        watch.wrote()
        self.sending = False

    def heartbeat_due(self) -> None:
        """``WriteWatch``'s poke on silence: one ``: keep-alive``, in a task of
        its own (the reader's task waits on the store), while the response
        follows the log and no write is in flight; the reader's next write
        waits for it."""
        pushing = self.pushing
        if pushing is None or self.sending or self.beat is not None:
            return
        loop = asyncio.get_running_loop()
        self.beat = loop.create_task(self._heartbeat(pushing[0], pushing[1]))

    async def _heartbeat(self, send: Send, watch: WriteWatch) -> None:
        try:
            with contextlib.suppress(OSError):  # the reader's own write sees it
                self.sending = True
                watch.writing()
                try:
                    await body_part(send, _KEEP_ALIVE)
                finally:
                    self.sending = False
                watch.wrote()
        finally:
            self.beat = None


async def body_part(send: Send, body: bytes, *, more_body: bool = True) -> None:
    """Send one ``http.response.body`` message."""
    await send({"type": "http.response.body", "body": body, "more_body": more_body})
