"""The pump: the one loop that moves a streamed response's frames to its sink.

``pump(source, sink)`` is the write loop of every streamed response: wait for
the source, settle what the sink started from a callback, take the frames that
are ready, write them, report. Two sources feed it:

- ``EventFrames``: a generation's events from a ``StreamBuffer`` (bounded,
  coalescing), turned into frames by the stream's ``Wire`` machine. A live
  stream (direct or through the gateway) writes them to its connection with
  heartbeats on silence, paced or on a clock if asked; a resumable stream's
  producer writes them to its log. Unpaced, it is also the buffer's ``direct``:
  an event that comes while the pump waits with nothing queued goes through the
  machine in the engine's callback, and its frames through ``FrameSink.offer``
  at the end of that loop turn, with every other frame of the stream that came
  in the same turn (the events of one token, the choices of one engine step,
  an upstream's burst): one write, and one loop callback per turn for all
  streams (``_Turn``).
- ``LogFrames`` (``resumable/log_writes.py``): the batches a log's reader reads from the
  store, each frame after its ``id:`` line.

The source reports what became of its frames to whoever decides (the machine:
``wrote()``, ``write_failed()``); the pump decides nothing.

Invariants:
    - Frames go out in the order the source took them; nothing is written after
      a failed write.
    - A write ``offer`` started is settled before anything else is taken.

Spec: docs/DESIGN.md, "Slow consumers" and "The wire" (heartbeats).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Protocol

from sluicegate.core.events import Delta, Heartbeat, StreamEvent
from sluicegate.core.wire.contracts import Wire
from sluicegate.engines.clocks import Timers
from sluicegate.server.streaming.buffer import StreamBuffer
from sluicegate.server.streaming.sink import BUSY, WROTE, Frames, FrameSink
from sluicegate.server.streaming.write_watch import WriteWatch

__all__ = ["EventFrames", "FrameSource", "pump", "sleep_until"]

_HEARTBEAT = Heartbeat()


class FrameSource(Protocol):
    """What ``pump`` reads frames from."""

    async def wait(self) -> None:
        """Return when frames may be ready, or the source ended."""
        ...

    def take(self) -> Frames | None:
        """The frames ready now (``[]``: none); ``None``: the source ended."""
        ...

    def wrote(self) -> None:
        """Every frame taken so far was written."""
        ...

    def write_failed(self) -> None:
        """Writing stopped: the frames since the last ``wrote()`` did not go out."""
        ...


async def pump(source: FrameSource, sink: FrameSink) -> bool:
    """Write ``source``'s frames through ``sink`` until it ends.

    Returns:
        True when the source ended, False when the connection broke (the
        source was told ``write_failed()``).

    Raises:
        Exception: what the sink's writes met other than a broken connection
            (a store's error, a bug met in a callback).
    """
    while True:
        await source.wait()
        if not sink.idle:
            if not await sink.settle():
                source.write_failed()
                return False
            source.wrote()
        frames = source.take()
        if frames is None:
            return True
        if frames:
            if not await sink.write(frames):
                source.write_failed()
                return False
            source.wrote()


async def sleep_until(clock: Timers, when: float) -> None:
    """Return once ``clock.time()`` reaches ``when`` (seconds)."""
    if clock.time() >= when:
        return
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not waiter.done():
            waiter.set_result(None)

    timer = clock.call_at(when, wake)
    try:
        await waiter
    finally:
        timer.cancel()


class _Turn:
    """Writes deferred to the end of the current loop turn: one ``call_soon``
    per turn for every stream of the loop."""

    __slots__ = ("__weakref__", "_due", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._due: list[EventFrames] = []

    def defer(self, source: EventFrames) -> None:
        due = self._due
        if not due:
            self._loop.call_soon(self._run)
        due.append(source)

    def _run(self) -> None:
        due, self._due = self._due, []
        for source in due:
            source.flush()


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turn] = (
    weakref.WeakKeyDictionary()
)


def _turn() -> _Turn:
    loop = asyncio.get_running_loop()
    turn = _turns.get(loop)
    if turn is None:
        turn = _turns[loop] = _Turn(loop)
    return turn


class EventFrames:
    """A stream's events from its buffer, as frames of its machine (see the module).

    Args:
        machine: the stream's machine; told ``wrote()``/``write_failed()``.
        buffer: where the generation puts the stream's events.
        sink: where the frames go; with ``eager``, this source writes through
            its ``offer`` from the buffer's ``direct``.
        clock: what pacing and the cadence run on.
        watch: the sink's watch; a heartbeat goes out when it says the stream
            was ``silent`` (``None``: no heartbeats, a producer's log).
        eager: write events from the buffer's ``direct`` (unpaced streams).
        interval_s: after a write with content, seconds before the next one
            (0: none); what comes meanwhile is coalesced.
        cadence_s: write on a clock of this period (seconds; 0: off): each tick
            writes what came since the last, or one heartbeat.
        on_heartbeat: called after each heartbeat went out.
        hold_last: keep the frames that end the machine in ``last``, unwritten
            (``take()`` returns ``None`` instead), for the caller to write
            with the body's end; the machine is told ``wrote()`` by whoever
            writes them.
    """

    __slots__ = (
        "_buffer",
        "_cadence_s",
        "_clock",
        "_due",
        "_interval_s",
        "_machine",
        "_on_heartbeat",
        "_paused",
        "_ready",
        "_settles",
        "_sink",
        "_turn",
        "_watch",
        "beat",
        "hold_last",
        "last",
    )

    def __init__(
        self,
        machine: Wire,
        buffer: StreamBuffer,
        sink: FrameSink,
        clock: Timers,
        *,
        watch: WriteWatch | None = None,
        eager: bool = False,
        interval_s: float = 0.0,
        cadence_s: float = 0.0,
        on_heartbeat: Callable[[], None] | None = None,
        hold_last: bool = False,
    ) -> None:
        self._machine = machine
        self._buffer = buffer
        self._sink = sink
        self._clock = clock
        self._watch = watch
        self._interval_s = interval_s
        self._cadence_s = cadence_s
        self._on_heartbeat = on_heartbeat
        self._due = clock.time()  # the cadence's next tick
        self._paused = False  # a paced write went out: wait interval_s first
        self.beat = False  # the frames taken last are a heartbeat
        self._ready: Frames | None = None  # fed in this turn, not yet written
        self._settles = False  # _ready holds frames that move the outcome
        self._turn: _Turn | None = None
        self.hold_last = hold_last
        self.last: Frames | None = None  # with hold_last: the frames that end
        if eager and interval_s <= 0 and cadence_s <= 0:
            self._turn = _turn()
            buffer.direct = self

    def close(self) -> None:
        """Stop taking events from the buffer's ``direct``; drop frames not
        yet written (the stream ended without them)."""
        if self._buffer.direct is self:
            self._buffer.direct = None
        self._ready = None

    def __call__(self, event: StreamEvent) -> None:
        """The buffer's ``direct``: ``event`` through the machine now, its
        frames written at the end of this loop turn (``flush``), with the rest
        of the turn's. Once per token per stream: kept flat."""
        machine = self._machine
        try:
            frames = machine.feed(event)
        except Exception as exc:  # the pump raises it: nothing reaches the engine
            self._sink.failure = exc
            self._buffer.poke()
            return
        if frames:
            ready = self._ready
            if ready is None:
                self._ready = frames
                assert self._turn is not None, "direct is set with the turn"
                self._turn.defer(self)
            else:
                self._ready = [*ready, *frames]  # never grow the machine's list
        if type(event) is not Delta:  # content moves no outcome
            self._settles = True
            # Only an End or a Fail ends the machine: the pump returns then
            # (after the flush, which comes first), and what comes after is
            # queued, then dropped.
            if machine.end_state is not None:
                self._buffer.poke()

    def flush(self) -> None:
        """At the end of the loop turn: the turn's frames through the sink in
        one write. The pump is woken when the write did not end here (it
        finishes it, or raises what it met)."""
        frames = self._ready
        if frames is None:
            return  # the pump took them, or the stream ended
        self._ready = None
        settles, self._settles = self._settles, False
        if self.hold_last and self._machine.end_state is not None:
            self.last = frames  # the caller writes them with the body's end
            self._buffer.poke()
            return
        offered = self._sink.offer(frames)
        if offered is not WROTE:
            if offered is BUSY:  # the pump's task writes them after its own
                self._ready, self._settles = frames, settles
                self._buffer.poke()
            return  # STARTED or FAILED: the sink woke the pump (on_pending)
        if settles:
            self._machine.wrote()

    async def wait(self) -> None:
        """Until events are queued or the buffer is poked; on a clock, until
        the next tick; paced, ``interval_s`` after a write first."""
        if self._machine.end_state is not None:
            return
        if self._cadence_s > 0:
            self._due += self._cadence_s
            now = self._clock.time()
            if self._due > now:
                await sleep_until(self._clock, self._due)
            else:  # a tick missed (a slow write): the clock starts again now
                self._due = now
            return
        if self._paused:
            self._paused = False
            await sleep_until(self._clock, self._clock.time() + self._interval_s)
        await self._buffer.wait()

    def take(self) -> Frames | None:
        """The frames of what the buffer holds (coalesced); a heartbeat when it
        holds nothing and the stream was silent (on a clock: at every empty
        tick); ``None`` once the machine ended."""
        machine = self._machine
        self.beat = False
        ready, self._ready = self._ready, None
        if ready is not None:  # fed in this turn: before anything else
            self._settles = False
            events = self._buffer.drain()
            frames = [*ready, *self._frames(events)] if events else ready
            return self._unless_last(frames)
        if machine.end_state is not None:
            return None
        events = self._buffer.drain()
        if not events:
            if self._cadence_s <= 0 and (self._watch is None or not self._watch.silent):
                return []  # a poke that came early
            return self._heartbeat()
        frames = self._frames(events)
        if not frames and self._cadence_s > 0:  # only what sends nothing
            return self._heartbeat()
        if frames and self._interval_s > 0 and machine.end_state is None:
            self._paused = True
        return self._unless_last(frames)

    def _unless_last(self, frames: Frames) -> Frames | None:
        """``frames``, or ``None`` when they end the machine and are held."""
        if self.hold_last and frames and self._machine.end_state is not None:
            self.last = frames
            return None
        return frames

    def _frames(self, events: list[StreamEvent]) -> Frames:
        machine = self._machine
        if len(events) == 1:
            return [] if machine.end_state is not None else machine.feed(events[0])
        frames: list[bytes] = []
        for event in events:
            # The machine may have ended in the engine's callback (a give up
            # there) while events already on their way were queued: dropped.
            if machine.end_state is not None:
                break
            frames += machine.feed(event)
        return frames

    def _heartbeat(self) -> Frames:
        self.beat = self._cadence_s <= 0  # a tick's empty event is no heartbeat
        return self._machine.feed(_HEARTBEAT)

    def wrote(self) -> None:
        """See ``FrameSource.wrote``; counts a heartbeat."""
        self._machine.wrote()
        if self.beat:
            self.beat = False
            if self._on_heartbeat is not None:
                self._on_heartbeat()

    def write_failed(self) -> None:
        """See ``FrameSource.write_failed``."""
        self._machine.write_failed()
