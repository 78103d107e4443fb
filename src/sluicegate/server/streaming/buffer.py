"""The buffers between a generation and its (maybe slow) client.

``Outbox`` is the channel from the decoder to one writer: ``put`` never blocks,
the writer ``wait()``s and ``drain()``s at its own pace, and while it waits with
nothing queued it may take events at once through ``direct`` (eager writes).

``StreamBuffer`` is the ``Outbox`` of one response with two additions:

- it counts the bytes of content waiting for the client, and calls
  ``on_overflow`` once when they pass ``max_bytes`` (the response then aborts
  the engine request and closes: memory per stream stays bounded);
- ``drain()`` merges what piled up while the socket was behind into one ``Delta``
  per choice and kind of output (``coalesce.py``: reasoning, content and tool
  calls are never merged into one). When the client keeps up, each drain holds one event
  and nothing is merged, so the first token is never delayed.

``LiveStreams`` is the set of buffers of the responses now running, for the
graceful drain (``shutdown.py``) and the metrics (``metering/metrics.py``).

Invariants:
    - Per choice, text order is kept and every ``Delta`` stays before that
      choice's ``Finish``; ``End``/``Fail`` stay last.
    - A coalesced ``Delta`` carries one kind of output, unless one ``Delta`` put
      carried several.
    - ``put`` never blocks and never waits on the client.
    - An event handed to ``direct`` is never queued, counted or drained.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable

from sluicegate.core.events import Delta, StreamEvent
from sluicegate.engines.clocks import Timers
from sluicegate.server.streaming.coalesce import coalesce

__all__ = [
    "EVENT_COST_BYTES",
    "LiveStreams",
    "Outbox",
    "StreamBuffer",
    "TokenBatches",
    "stream_buffer",
]


class Outbox:
    """Events from the decoder to one writer; ``put`` never blocks.

    Unbounded. asyncio only: it runs once per token per stream, and a bare
    future is the cheapest wake-up there is.

    Subclasses extend it through one hook, ``_queued(event)``: called for each
    event that ``put`` queues (not for one handed to ``direct``), before the
    writer is woken. ``StreamBuffer`` counts bytes there.

    Args:
        clock: what ``wait``'s time limit runs on; ``None``: the running loop.

    Attributes:
        direct: takes an event in place of the queue while the writer waits in
            ``wait()`` with nothing queued (the writer then writes the event
            itself, and ``poke()``-s itself if it has more to do). The writer
            sets it; ``None`` (the default): every event is queued.
    """

    def __init__(self, clock: Timers | None = None) -> None:
        self._clock = clock
        self._events: deque[StreamEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None
        # Asked once, not per wait: get_running_loop() is a getpid system call
        # in CPython 3.11, and the writer waits once per token.
        self._loop: asyncio.AbstractEventLoop | None = None
        self.direct: Callable[[StreamEvent], None] | None = None

    def put(self, event: StreamEvent) -> None:
        """Queue ``event`` and wake the writer, or hand it to ``direct``."""
        direct = self.direct
        if direct is not None and not self._events:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                direct(event)
                return
        self._queued(event)
        self._events.append(event)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _queued(self, event: StreamEvent) -> None:
        """The subclass hook: ``event`` is about to be queued (see the class)."""

    def poke(self) -> None:
        """Wake the writer, whether or not anything is queued."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def drain(self) -> list[StreamEvent]:
        """Every queued event, oldest first (``[]`` when none)."""
        events = list(self._events)
        self._events.clear()
        return events

    async def wait(self, timeout_s: float = math.inf) -> None:
        """Return when an event is queued, ``poke()`` is called, or after
        ``timeout_s`` seconds on its clock (``math.inf``: no time limit)."""
        if self._events or timeout_s <= 0:
            return
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None
        if timeout_s != math.inf:
            clock: Timers = self._clock or loop
            timer = clock.call_at(clock.time() + timeout_s, lambda: _wake(waiter))
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


EVENT_COST_BYTES = 128
"""What one queued event costs beyond its text (the ``Delta`` object, the string
header, the deque slot), counted toward ``max_bytes`` so that the limit bounds the
memory a stuck stream holds, not only its text: a client that stops reading while
the engine makes one-byte tokens would otherwise hold about 30x the limit."""


def _cost(event: Delta) -> int:
    text = event.text
    size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
    parts = event.parts
    if parts is not None:
        size += _text_bytes(parts.reasoning) + sum(
            _text_bytes(f.arguments) + EVENT_COST_BYTES for f in parts.tool_calls
        )
    return size + EVENT_COST_BYTES


def _text_bytes(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


class StreamBuffer(Outbox):
    """An ``Outbox`` bounded in bytes whose ``drain`` coalesces deltas.

    Args:
        max_bytes: bytes that may wait for the client (>= 1): the UTF-8 content
            plus ``EVENT_COST_BYTES`` per queued delta.
        on_overflow: called once, from ``put``, when more than ``max_bytes`` wait.

    Attributes:
        pending_bytes: bytes (content plus per-event cost) queued since the last
            ``drain``.
        coalesced: deltas merged into others so far.
        overflowed: whether ``on_overflow`` was called.

    Raises:
        ValueError: ``max_bytes`` < 1.
    """

    def __init__(
        self, max_bytes: int, on_overflow: Callable[[], None] | None = None
    ) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes!r}")
        super().__init__()
        self.max_bytes = max_bytes
        self.pending_bytes = 0
        self.coalesced = 0
        self.overflowed = False
        self._on_overflow = on_overflow

    def _queued(self, event: StreamEvent) -> None:
        """Count a queued delta; past ``max_bytes``, report the overflow once."""
        if isinstance(event, Delta):
            self.pending_bytes += _cost(event)
            if self.pending_bytes > self.max_bytes and not self.overflowed:
                self.overflowed = True
                if self._on_overflow is not None:
                    self._on_overflow()

    def drain(self) -> list[StreamEvent]:
        """Every queued event, deltas coalesced per choice (``[]`` when none)."""
        events = super().drain()
        self.pending_bytes = 0
        if len(events) > 1:  # a client that keeps up takes one event at a time
            events, merged = coalesce(events)
            self.coalesced += merged
        return events


class TokenBatches(StreamBuffer):
    """A ``StreamBuffer`` that wakes its writer once every ``every`` deltas.

    vLLM's ``--stream-interval`` (its scheduler's ``stream_interval``): a
    stream's first delta goes at once, then deltas wait, queued and counted
    toward ``max_bytes`` as in any buffer, until ``every`` of them do; any
    other event (a ``Finish``, the ``End``, a ``Fail``) and a ``poke`` (a
    heartbeat due, a deadline) wake the writer at once, which takes them all,
    coalesced. A delta is one engine output of one choice (a token of a local
    engine, an event of an upstream one), counted over the stream's choices.

    Args:
        max_bytes: see ``StreamBuffer``.
        on_overflow: see ``StreamBuffer``.
        every: deltas per write (>= 2; 1 is a plain ``StreamBuffer``).

    Raises:
        ValueError: ``every`` < 2, or ``max_bytes`` < 1.
    """

    def __init__(
        self, max_bytes: int, on_overflow: Callable[[], None] | None, every: int
    ) -> None:
        if every < 2:
            raise ValueError(f"expected every >= 2, got {every!r}")
        super().__init__(max_bytes, on_overflow)
        self._every = every
        self._held = every - 1  # the first delta goes at once

    def put(self, event: StreamEvent) -> None:
        """Hold a delta until ``every`` wait; queue anything else and wake."""
        if type(event) is Delta:
            held = self._held + 1
            if held < self._every:
                self._held = held
                self._queued(event)
                self._events.append(event)
                return
        self._held = 0
        super().put(event)

    def drain(self) -> list[StreamEvent]:
        """See ``StreamBuffer.drain``; the count starts again."""
        self._held = 0
        return super().drain()


def stream_buffer(
    max_bytes: int, on_overflow: Callable[[], None] | None, every_tokens: int = 1
) -> StreamBuffer:
    """A stream's buffer: a ``TokenBatches`` when ``every_tokens`` > 1."""
    if every_tokens > 1:
        return TokenBatches(max_bytes, on_overflow, every_tokens)
    return StreamBuffer(max_bytes, on_overflow)


class LiveStreams:
    """The buffers of the responses now running, and counters over all of them.

    Attributes:
        heartbeats_sent: ``: keep-alive`` comments written (all streams, ever).
        aborted_slow: streams aborted for a full buffer or a stuck socket.
    """

    def __init__(self) -> None:
        self._buffers: set[StreamBuffer] = set()
        self._closed_coalesced = 0
        self.heartbeats_sent = 0
        self.aborted_slow = 0

    def count_heartbeat(self) -> None:
        """One more ``: keep-alive`` comment was written."""
        self.heartbeats_sent += 1

    def open(self, buffer: StreamBuffer) -> None:
        """Count ``buffer`` as live until ``close(buffer)``."""
        self._buffers.add(buffer)

    def close(self, buffer: StreamBuffer) -> None:
        """``buffer``'s response ended; keep its coalesced count."""
        if buffer in self._buffers:
            self._buffers.discard(buffer)
            self._closed_coalesced += buffer.coalesced

    @property
    def buffers(self) -> list[StreamBuffer]:
        """The live buffers (a copy)."""
        return list(self._buffers)

    @property
    def pending_bytes(self) -> int:
        """Content bytes waiting for clients, over all live streams."""
        return sum(b.pending_bytes for b in self._buffers)

    @property
    def coalesced_events(self) -> int:
        """Deltas merged into others, over all streams, ever."""
        return self._closed_coalesced + sum(b.coalesced for b in self._buffers)

    def __len__(self) -> int:
        return len(self._buffers)
