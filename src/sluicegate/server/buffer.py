"""The bounded, coalescing buffer between a generation and its (maybe slow) client.

``StreamBuffer`` is the ``Outbox`` of one response with two additions:

- it counts the bytes of content waiting for the client, and calls
  ``on_overflow`` once when they pass ``max_bytes`` (the response then aborts
  the engine request and closes: memory per stream stays bounded);
- ``drain()`` merges what piled up while the socket was behind into one ``Delta``
  per choice (``coalesce``). When the client keeps up, each drain holds one event
  and nothing is merged, so the first token is never delayed.

``LiveStreams`` is the set of buffers of the responses now running, for the
graceful drain (``shutdown.py``) and the metrics (``metrics.py``).

Invariants:
    - Per choice, text order is kept and every ``Delta`` stays before that
      choice's ``Finish``; ``End``/``Fail`` stay last.
    - ``put`` never blocks and never waits on the client.

Spec: ../shared/DESIGN.md, "Slow consumers"; issue 5, "Slow consumers".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from sluicegate.core.events import Delta, Finish, StreamEvent
from sluicegate.server.generation import Outbox

__all__ = ["EVENT_COST_BYTES", "LiveStreams", "StreamBuffer", "coalesce", "join_deltas"]


def join_deltas(first: Delta, second: Delta) -> Delta:
    """One ``Delta`` saying what ``first`` then ``second`` say (same choice).

    Generic over ``Delta``'s fields, so fields added later join too: strings and
    tuples (text, logprobs) concatenate; any other field (a running snapshot such
    as the usage so far) takes ``second``'s value unless that is ``None``.

    Raises:
        ValueError: the two deltas belong to different choices.
    """
    if first.index != second.index:
        raise ValueError(
            f"expected deltas of one choice, got {first.index!r} and {second.index!r}"
        )
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(first):
        a, b = getattr(first, field.name), getattr(second, field.name)
        if type(a) is type(b) and isinstance(a, str | tuple):
            changes[field.name] = a + b
        elif field.name != "index":
            changes[field.name] = a if b is None else b
    return dataclasses.replace(first, **changes)


def coalesce(events: list[StreamEvent]) -> tuple[list[StreamEvent], int]:
    """Merge each choice's pending deltas into one; returns (events, merged count).

    A ``Delta`` joins the earlier ``Delta`` of its choice in ``events`` unless that
    choice's ``Finish`` came between (it cannot, for a well-formed generation) or
    an ``End``/``Fail``/``Heartbeat`` did. ``merged`` counts the deltas that were
    folded into another (0 when nothing piled up).
    """
    out: list[StreamEvent] = []
    open_at: dict[int, int] = {}
    merged = 0
    for event in events:
        if isinstance(event, Delta):
            at = open_at.get(event.index)
            if at is not None:
                previous = out[at]
                assert isinstance(previous, Delta)
                out[at] = join_deltas(previous, event)
                merged += 1
                continue
            open_at[event.index] = len(out)
        elif isinstance(event, Finish):
            open_at.pop(event.index, None)
        else:
            open_at.clear()
        out.append(event)
    return out, merged


EVENT_COST_BYTES = 128
"""What one queued event costs beyond its text (the ``Delta`` object, the string
header, the deque slot), counted toward ``max_bytes`` so that the limit bounds the
memory a stuck stream holds, not only its text: a client that stops reading while
the engine makes one-byte tokens would otherwise hold about 30x the limit."""


def _cost(event: Delta) -> int:
    text = event.text
    size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
    return size + EVENT_COST_BYTES


class StreamBuffer(Outbox):
    """An ``Outbox`` bounded in bytes whose ``drain`` coalesces deltas.

    Args:
        max_bytes: bytes that may wait for the client (>= 1): the UTF-8 content
            plus ``EVENT_COST_BYTES`` per queued delta.
        on_overflow: called once, from ``put``, when more than ``max_bytes`` wait.

    Attributes:
        pending_bytes: bytes (content plus per-event cost) put since the last
            ``drain``.
        coalesced: deltas merged into others so far.
        overflowed: whether ``on_overflow`` was called.
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
        self.direct: Callable[[StreamEvent], None] | None = None
        """Takes an event in place of the queue while the writer waits in
        ``wait()`` with nothing queued (it then writes the event itself, and
        ``poke()``-s the writer if the writer has more to do). The writer sets
        it; ``None``: every event is queued."""

    def put(self, event: StreamEvent) -> None:
        """Queue ``event``; past ``max_bytes`` of content, report the overflow once.

        With ``direct`` set, an event that comes while the writer waits and
        nothing is queued goes to ``direct`` instead, at once (see ``direct``).
        """
        direct = self.direct
        if direct is not None and not self._events:
            waiter = self._waiter
            if waiter is not None and not waiter.done():
                direct(event)
                return
        if isinstance(event, Delta):
            self.pending_bytes += _cost(event)
            if self.pending_bytes > self.max_bytes and not self.overflowed:
                self.overflowed = True
                if self._on_overflow is not None:
                    self._on_overflow()
        super().put(event)

    def drain(self) -> list[StreamEvent]:
        """Every queued event, deltas coalesced per choice (``[]`` when none)."""
        events = super().drain()
        self.pending_bytes = 0
        if len(events) > 1:  # a client that keeps up takes one event at a time
            events, merged = coalesce(events)
            self.coalesced += merged
        return events


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
