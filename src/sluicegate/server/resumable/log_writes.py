"""The frames of one log reader's body: read from the store, or pushed.

``LogFrames`` is the ``pump``'s source (``streaming/pump.py``) for a reader of a
resumable response's log (``log_response.py``): the batches the store's read
yields, each frame after its ``id:`` line. A store that pushes (``PushRead``)
hands it live frames from the producer's call instead (``push``): they go
through the reader's ``FrameSink.offer`` at once and, when ``send`` finishes
without suspending (a socket that keeps up), the reader's task is never woken
for that frame. A write that suspends is finished by the sink's own task; while
it (or a heartbeat) is in flight, or before the response follows the log,
``push`` refuses frames and the reader's task writes them after it.

Invariants:
    - Writes never interleave (the sink's): a refused push is read by the
      reader's task and written after the write in flight.
    - No frame is pushed to a reader whose task is being cancelled (its client
      left): a write started then could never be finished.
    - A pushed write that meets a broken connection stops the reader at once
      (the sink's ``on_broken``, ``BROKEN``); any other failure is kept for
      the reader's task to raise at its next batch or at the log's end.

Deliberate divergence: a heartbeat is the line ``: keep-alive`` with no blank
line after it (the live path sends a blank line too): the openai SDK, once it
has seen an ``id``, dispatches an empty event at every blank line and fails on
it; to WHATWG, and to ``core.sse``, a comment line is a comment line either way.

Spec: WHATWG HTML, "9.2 Server-sent events" (``id`` field); ASGI, "HTTP".
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from sluicegate.core.wire.sse import encode_comment
from sluicegate.server.stores.event_store import Frames as Batch
from sluicegate.server.streaming.sink import STARTED, WROTE, Frames, FrameSink

__all__ = ["BROKEN", "LogFrames"]

BROKEN = "the connection broke"
"""``LogStreamResponse.cut`` when a write of a pushed frame met a broken socket."""

# A comment line without the blank line after it: an event stream with ids makes
# the openai SDK dispatch an empty event at every blank line (it keeps the last
# id), which it then fails to parse; WHATWG ignores a comment line either way.
_KEEP_ALIVE = [encode_comment("keep-alive").rstrip(b"\n") + b"\n"]


class LogFrames:
    """The frames of one reader of the log of ``response_id`` (see the module).

    Attributes:
        prefix: the response id, encoded: each frame's ``id:`` line names it.
    """

    __slots__ = ("_batch", "_batches", "_sink", "_task", "prefix")

    def __init__(self, response_id: str) -> None:
        self.prefix = response_id.encode()
        self._batches: AsyncIterator[Batch] | None = None
        self._batch: Batch | None = None  # read, not yet taken
        self._sink: FrameSink | None = None  # set while the response follows
        self._task: asyncio.Task[object] | None = None

    def follow(
        self, first: Batch, batches: AsyncIterator[Batch], sink: FrameSink
    ) -> None:
        """From now on (in the reader's task): ``first``, then ``batches``,
        through ``sink``; pushed frames too."""
        self._batch = first
        self._batches = batches
        self._sink = sink
        self._task = asyncio.current_task()

    def unfollow(self) -> None:
        """The response stopped following the log: push nothing more."""
        self._sink = None
        self._task = None
        self._batches = None

    def push(self, batch: Batch) -> bool:
        """The ``push`` of ``read_pushed``: write ``batch`` now, from the
        store's call, unless the response does not follow the log (yet, or any
        more), the sink is busy or failed (then the reader's task takes it),
        or the reader's task is being cancelled (its client left: the frame is
        not written at all). Once per token: kept flat."""
        sink, task = self._sink, self._task
        if sink is None or task is None or task.cancelling():
            return False
        offered = sink.offer(self._framed(batch))
        return offered is WROTE or offered is STARTED

    def heartbeat_due(self) -> None:
        """``WriteWatch``'s poke on silence: one ``: keep-alive`` through the
        sink, from the timer's call (the reader's task waits on the store),
        while the response follows the log and no write is in flight."""
        sink = self._sink
        if sink is not None and sink.idle:
            sink.offer(_KEEP_ALIVE, lossy=True)  # a broken socket: the next write

    def _framed(self, batch: Batch) -> Frames:
        prefix = self.prefix
        if len(batch) == 1:
            seq, frame = batch[0]
            return [b"id: %s.%d\n%s" % (prefix, seq, frame)]
        return [b"".join(b"id: %s.%d\n%s" % (prefix, seq, f) for seq, f in batch)]

    async def wait(self) -> None:
        """Read the next batch, unless one is waiting (or the log ended)."""
        if self._batch is None and self._batches is not None:
            try:
                self._batch = await anext(self._batches)
            except StopAsyncIteration:
                self._batches = None

    def take(self) -> Frames | None:
        """The batch read, framed; ``None`` once the log ended."""
        batch, self._batch = self._batch, None
        if batch is None:
            return None
        return self._framed(batch) if batch else []

    def wrote(self) -> None:
        """Nothing to report: a log's frames have no machine."""

    def write_failed(self) -> None:
        """Nothing to report: see ``wrote``."""
