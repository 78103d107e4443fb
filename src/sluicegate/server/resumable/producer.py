"""The producer of one resumable stream: its generation, written into its log.

A resumable stream is not written to a connection: its ``Producer`` runs in a
task of its own, feeds the generation's events to a ``StreamMachine`` and
appends the frames to the store, whoever reads them (``log_response.py``). It
never waits on a reader. While no reader is attached for ``grace_s`` seconds,
it puts a ``Fail`` (``resume_grace_expired``) into its buffer: the machine
writes that error event into the log (a late resume sees why the stream
ended), the engine request is aborted and its KV cells freed.

The producer writes as every stream does: the pump (``streaming/pump.py``) moves the
machine's frames through a ``FrameSink`` whose destination is the log. A store
that can append without awaiting (``SyncAppend``: the memory store) is fed from
the engine's callback while the pump waits with nothing queued (the sink's
``offer``, as for a connection): no task wake-up per token. Any other store is
fed by the pump's task; both write the same frames
(``tests/server/test_resumable_streams.py``).

Invariants:
    - The end state is the producer's, not a connection's: ``finished`` or
      ``errored`` from the machine's outcome, ``aborted`` when the grace ran out
      the buffer overflowed, or
      the client cancelled it (``cancel``).
    - The log is finished whatever ends the producer (the end, an error, a
      cancel at shutdown), then ``on_end`` is called once.
    - A shared store that fails under the stream (Redis gone, restarted, or
      full) ends it with one error event (``resume_store_unavailable``, or
      ``resume_store_full``), which its readers write themselves; the end
      state is ``errored`` and the engine request is aborted.
    - A store that sees every reader (``ReaderWatch``: the memory store) says
      when the last reader goes and when one comes back: the grace is one
      timer, armed and cancelled then, with no periodic work per stream. On
      any other store, readers are checked (and the producer's lease
      refreshed) every ``check_interval_s``: the grace runs out within one
      interval of its end.

Spec: docs/resumable-streams.md, "Disconnect policy".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import secrets
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import CANCELLED, Fail
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.contracts import Wire, stream_machine
from sluicegate.core.wire.padding import MIN_STEP_BYTES, Filler
from sluicegate.engines.clocks import Timer, Timers
from sluicegate.server.http.errors import STORE_LOST, StoreError, store_error_code
from sluicegate.server.stores.event_store import EventStore
from sluicegate.server.streaming.buffer import LiveStreams, StreamBuffer, stream_buffer
from sluicegate.server.streaming.generation import INTERNAL_ERROR_MESSAGE, Generation
from sluicegate.server.streaming.pump import EventFrames, pump, sleep_until
from sluicegate.server.streaming.shared import StreamLimits, attached
from sluicegate.server.streaming.sink import FrameSink

__all__ = ["BUFFER_FULL", "GRACE_EXPIRED", "Producer", "SyncAppend"]

logger = logging.getLogger(__name__)

GRACE_EXPIRED = "resume_grace_expired"
"""Error code of the event that ends a stream nobody resumed in time."""

BUFFER_FULL = "stream_buffer_full"
"""Error code of the event that ends a stream whose store fell behind the engine."""


_CANCEL_REASON = "The client cancelled this stream"


_WatchReaders = Callable[[str, Callable[[bool], None] | None], bool]
"""``ReaderWatch.watch_readers``."""


class SyncAppend(Protocol):
    """A store that appends at once, without a coroutine (the memory store)."""

    def append_nowait(self, response_id: str, frames: Sequence[bytes]) -> None:
        """``EventStore.append``, done before it returns."""
        ...


class Producer:
    """Generates one resumable response into its log, whoever reads it.

    Args:
        store: where the log is (``create``-d already).
        generation: already ``start()``-ed.
        header: what every chunk shares.
        limits: the stream's deadlines and buffer bound (heartbeats are the
            readers').
        live: where the producer's buffer is registered (the graceful drain
            puts its shutdown ``Fail`` there).
        grace_s: seconds without a reader before the engine request is aborted.
        on_end: awaited once when the producer ends, with the end state and
            whether the server gave the stream up on its own (no reader
            within the grace period, a full buffer; not a client's cancel).
        check_interval_s: seconds between checks of the readers (and leases),
            on a store that is not a ``ReaderWatch``.
        padded: pad every frame (``core/wire/padding.py``, the ``obfuscation`` field),
            as a live stream would be. A resumable stream has no cadence.
        ended: awaited with the machine once it ended, before the log is
            finished (so that a reader that saw the log's end sees what it
            kept); what it raises is logged.
        clock: what the grace timer and the readers' checks run on; default:
            ``limits.clock``, else the running event loop. Tests step a
            ``ManualClock``.
    """

    def __init__(
        self,
        store: EventStore,
        generation: Generation,
        header: ResponseHeader,
        limits: StreamLimits,
        live: LiveStreams,
        grace_s: float,
        on_end: Callable[[EndState, bool], Awaitable[None]],
        check_interval_s: float = 1.0,
        *,
        padded: bool = False,
        ended: Callable[[Wire], Awaitable[None]] | None = None,
        clock: Timers | None = None,
    ) -> None:
        self._store = store
        self._generation = generation
        # Padded as a live stream is (core/wire/padding.py): the log keeps the padded
        # frames, so a resume replays the same sizes.
        filler = Filler(secrets.randbits(128)) if padded else None
        self._machine = stream_machine(header, filler, MIN_STEP_BYTES)
        self._id = header.id
        self._limits = limits
        self._live = live
        self._grace_s = grace_s
        self._on_end = on_end
        self._ended = ended
        self._check_s = check_interval_s
        self._buffer: StreamBuffer | None = None
        self._cancel_early = False  # cancel() came before the buffer
        self._clock = clock
        self._grace_timer: Timer | None = None  # armed: no reader
        self._store_failed = False  # ended by the store's failure (_fail_store)
        self.abandoned: str | None = None
        """Why the producer gave up (grace ran out, buffer full), or ``None``."""

    async def run(self) -> None:
        """Produce until the machine ends; finish the log; report the end state."""
        machine, store = self._machine, self._store
        try:
            await store.append(self._id, machine.start())
            machine.wrote()
            await self._produce()
        except asyncio.CancelledError:
            machine.write_failed()  # the server stops: nothing more goes out
            raise
        except StoreError as exc:  # the shared store failed under the stream
            logger.warning("resumable stream %s ended: %s", self._id, exc)
            await self._fail_store(exc)
        except Exception:  # the producer task's outermost frame: log, one error
            logger.exception("resumable stream %s failed", self._id)
            await self._fail_internal()
        finally:
            self._generation.abort_unfinished()
            if self._ended is not None:
                try:
                    await self._ended(machine)
                except Exception:  # the log is finished whatever the hook met
                    logger.exception("end of resumable stream %s", self._id)
            try:
                await store.finish(self._id)
            except StoreError:  # the shared store is gone: the row is kept
                logger.warning(
                    "resumable stream %s: its log could not be finished", self._id
                )
            state = (
                EndState.ABORTED
                if self.abandoned
                else EndState.ERRORED
                if self._store_failed
                else machine.outcome
            )
            self._buffer = None  # it holds _overflow: no cycle outlives the stream
            given_up = self.abandoned is not None and not self.cancelled
            await self._on_end(state, given_up)

    async def _produce(self) -> None:
        limits = self._limits
        buffer = stream_buffer(
            limits.max_buffer_bytes, self._overflow, limits.interval_tokens
        )
        self._buffer = buffer
        if self._cancel_early:
            self._give_up(buffer, _CANCEL_REASON, CANCELLED)
        store, response_id = self._store, self._id
        eager = store.capabilities.eager_append
        sink = FrameSink(
            functools.partial(store.append, response_id),
            None,
            on_pending=buffer.poke,
            at_once=(
                None
                if eager is None
                else functools.partial(eager.append_nowait, response_id)
            ),
            broken=(),  # a store's failure is the producer's to handle
        )
        clock = self._timers()
        source = EventFrames(
            self._machine, buffer, sink, clock, eager=eager is not None
        )
        watch = self._store.capabilities.reader_watch
        watch_readers = None if watch is None else watch.watch_readers
        with attached(self._generation, buffer, self._live, self._limits):
            watcher = None
            if watch_readers is None:
                watcher = asyncio.get_running_loop().create_task(self._watch(buffer))
            elif self._grace_s == math.inf:  # a background one never gives up
                watch_readers = None
            else:
                self._time_readers(buffer, watch_readers)
            try:
                await pump(source, sink)
            finally:
                source.close()
                sink.close()
                if watcher is not None:
                    watcher.cancel()
                if watch_readers is not None:
                    watch_readers(self._id, None)
                    timer, self._grace_timer = self._grace_timer, None
                    if timer is not None:
                        timer.cancel()

    def _timers(self) -> Timers:
        return self._clock or self._limits.clock or asyncio.get_running_loop()

    def _overflow(self) -> None:
        if self._buffer is not None:
            self._give_up(self._buffer, "buffer full", BUFFER_FULL)

    def _time_readers(self, buffer: StreamBuffer, watch_readers: _WatchReaders) -> None:
        """The grace as one timer (a ``ReaderWatch`` store): armed when the last
        reader goes, cancelled when one comes."""
        clock = self._timers()
        grace_s = self._grace_s

        def expire() -> None:
            self._grace_timer = None
            message = f"No reader resumed this stream within {grace_s:g} s"
            self._give_up(buffer, message, GRACE_EXPIRED)

        def readers(attached: bool) -> None:
            timer = self._grace_timer
            if attached:
                if timer is not None:
                    timer.cancel()
                    self._grace_timer = None
            elif timer is None:
                self._grace_timer = clock.call_at(clock.time() + grace_s, expire)

        if not watch_readers(self._id, readers):
            readers(False)

    async def _watch(self, buffer: StreamBuffer) -> None:
        """Every ``check_interval_s``: lease; count the time without a reader."""
        store, response_id, clock = self._store, self._id, self._timers()
        alone_since: float | None = None
        while True:
            await sleep_until(clock, clock.time() + self._check_s)
            try:
                await store.lease(response_id)
                if await store.attached(response_id):
                    alone_since = None
                    continue
            except StoreError:  # unknown: the stream itself meets the failure
                continue
            now = clock.time()
            alone_since = now if alone_since is None else alone_since
            if now - alone_since >= self._grace_s:
                message = f"No reader resumed this stream within {self._grace_s:g} s"
                self._give_up(buffer, message, GRACE_EXPIRED)
                return

    @property
    def cancelled(self) -> bool:
        """Whether it was given up because its client cancelled it."""
        return self.abandoned == _CANCEL_REASON

    def cancel(self) -> bool:
        """Its client gave the stream up on purpose: abort it now (``cancelled``
        error event, end state ``aborted``); nothing happens once it ended.

        Returns:
            Whether this call aborted it (``False``: it had ended, or was being
            given up already).
        """
        if self._buffer is None:  # not producing yet: given up once it starts
            early = not self._cancel_early and self._machine.end_state is None
            self._cancel_early = True
            return early
        return self._give_up(self._buffer, _CANCEL_REASON, CANCELLED)

    def _give_up(self, buffer: StreamBuffer, reason: str, code: str) -> bool:
        # Once the machine ended (its end written from the engine's callback,
        # the task not yet run), the stream ended as written: nothing to give up.
        if self.abandoned is None and self._machine.end_state is None:
            self.abandoned = reason
            logger.info("resumable stream %s aborted: %s", self._id, reason)
            buffer.put(Fail(reason, code=code))
            return True
        return False

    async def _fail_store(self, exc: StoreError) -> None:
        """End the machine with the store's error event. Its readers write that
        event themselves (``LogStreamResponse``: the log cannot take it), so it
        counts as written: the end state is ``errored``."""
        self._store_failed = True
        try:
            frames = self._machine.feed(Fail(STORE_LOST, code=store_error_code(exc)))
        except LocalProtocolError:
            return  # its last frames met the failure: the readers got the error
        with contextlib.suppress(StoreError):  # kept if the store took it back
            await self._store.append(self._id, frames)
        self._machine.wrote()

    async def _fail_internal(self) -> None:
        try:
            fail = Fail(INTERNAL_ERROR_MESSAGE, code="internal_error")
            frames = self._machine.feed(fail)
        except LocalProtocolError:
            return  # the machine had ended: its outcome is what was written
        await self._store.append(self._id, frames)
        self._machine.wrote()
