"""The ASGI app that streams one generation as OpenAI chunks over SSE.

``EventStreamResponse`` sends the headers, then pumps the stream's events
through the ``StreamMachine`` to the connection (``pump.py``, through a
``FrameSink``), and a heartbeat when ``WriteWatch`` says the stream was silent.
It reports what happened (each write's outcome, the client leaving, a slow
client given up on) to the machine, whose ``outcome`` is the end state the
ledger records.

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
    - A buffer over its byte bound, or a write the client has not accepted within
      ``stuck_timeout_s``, aborts the engine request and closes (``aborted``).
    - Padded (``padded=True``), every frame's size is a step of the machine's
      ladder (``core/wire/padding.py``), its pad drawn from a generator seeded with
      128 bits of the operating system's CSPRNG, per stream.
    - With a cadence (``StreamLimits.cadence_s``), a write goes out on every
      tick of a fixed clock started at the headers and nowhere else: what came
      since the last tick, coalesced, or one heartbeat (padded: the size of a
      one-token event) when nothing did. The first token waits at most one tick.
      Padded on a clock, the ladder's first step is ``CADENCE_STEP_BYTES``.

Spec: docs/DESIGN.md, "The wire", "Slow consumers" and "End states";
WHATWG HTML, "9.2 Server-sent events".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
from typing import ClassVar

from starlette.types import Receive, Scope, Send

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import Fail
from sluicegate.core.wire.chunks import ResponseHeader
from sluicegate.core.wire.contracts import stream_machine
from sluicegate.core.wire.padding import MIN_STEP_BYTES, Filler
from sluicegate.server.http.chunked_body import ChunkedBodySend
from sluicegate.server.streaming.buffer import LiveStreams, StreamBuffer, stream_buffer
from sluicegate.server.streaming.disconnect import CLIENT_GONE, DisconnectRace
from sluicegate.server.streaming.generation import Generation
from sluicegate.server.streaming.pump import EventFrames, pump
from sluicegate.server.streaming.shared import OnEnd, StreamLimits, attached
from sluicegate.server.streaming.sink import (
    Frames,
    FrameSink,
    body_writes,
    body_writes_now,
)
from sluicegate.server.streaming.write_watch import WriteWatch

__all__ = ["BODY_SEND", "SSE_HEADERS", "EventStreamResponse"]

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

BODY_SEND = "sluicegate.body_send"
"""Scope key: the server's own ``send``, put there by the app before any wrapper.

An event stream sends its body frames with it, and only its start through the
``send`` it was called with: Starlette's exception middlewares wrap ``send`` to
learn whether a response started, which two coroutine frames per token would
tell them again and again. A stream never lets an exception out (see
``EventStreamResponse``), so they have nothing to do after the start.
Middleware added inside the app does not see stream bodies; wrap the app from
outside instead."""

CADENCE_STEP_BYTES = 64
"""The padding ladder's first step on a clock (bytes): a 50 ms tick of a CPU
model (a few tokens of a few bytes) fits in it."""


class EventStreamResponse:
    """An ASGI app that streams one generation as OpenAI chunks over SSE.

    Args:
        generation: already ``start()``-ed, so that a full engine queue was a 503
            before any byte.
        header: what every chunk shares (id, created, model, ``n``, usage option).
        limits: heartbeat interval, timeouts, buffer bound, stuck timeout, pacing.
        on_end: told the end state (``StreamMachine.outcome``) and status 200.
        live: where the stream's buffer is registered while it runs (the
            graceful drain puts its shutdown ``Fail`` there).
        padded: pad every frame (``core/wire/padding.py``, the ``obfuscation``
            field); the server's default is on (``ServerConfig.obfuscation``).

    A timeout or a shutdown ends the stream with one in-band error event (codes
    ``first_token_timeout``, ``request_timeout``, ``server_shutdown``), state
    ``errored``. A full buffer or a write stuck past ``stuck_timeout_s`` aborts
    the engine request and closes without an error event (the client is not
    reading it), state ``aborted``.

    Spec: OpenAI API reference, "Create chat completion", ``stream``;
    docs/DESIGN.md, "Slow consumers".
    """

    eager: ClassVar[bool] = True
    """Whether unpaced streams are also written from the engine's callback
    (``EventFrames``, ``FrameSink.offer``); paced ones are written by the pump
    only. Tests and benches set ``False`` here to compare the two."""

    def __init__(
        self,
        generation: Generation,
        header: ResponseHeader,
        limits: StreamLimits,
        on_end: OnEnd,
        live: LiveStreams | None = None,
        *,
        padded: bool = False,
    ) -> None:
        self._generation = generation
        filler = Filler(secrets.randbits(128)) if padded else None
        # On a clock an event carries a tick's tokens: one step holds more.
        step = CADENCE_STEP_BYTES if limits.cadence_s > 0 else MIN_STEP_BYTES
        self._machine = stream_machine(header, filler, step)
        self._limits = limits
        self._on_end = on_end
        self._live = live if live is not None else LiveStreams()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Write the stream until it ends, errs, or the client leaves."""
        machine = self._machine
        start, send = send, scope.get(BODY_SEND, send)
        ended = False  # the body's end went out with the last frames
        try:
            head = {
                "type": "http.response.start",
                "status": 200,
                "headers": SSE_HEADERS,
            }
            first = b"".join(machine.start())
            if isinstance(send, ChunkedBodySend):  # the head and first part: one write
                await send.start_with(start, head, first)
            else:
                await start(head)
                await _send_body(send, first)
            machine.wrote()
            last = await self._stream(receive, send)
            if last:  # the frames that end the stream, with the body's end
                if isinstance(send, ChunkedBodySend):
                    await send.end_with(b"".join(last))
                    ended = True
                else:
                    await _send_body(send, b"".join(last))
                machine.wrote()
        except asyncio.CancelledError:
            machine.write_failed()  # stopped by someone else: nothing more goes out
            raise
        except OSError:
            machine.write_failed()  # the connection broke before the stream began
        except Exception:  # the outermost frame: log, then one error event
            logger.exception("stream %s failed", machine.header.id)
            await self._send_error(send)
        finally:
            self._generation.abort_unfinished()
            self._on_end(machine.outcome, 200)
        if not ended and machine.outcome is not EndState.ABORTED:
            with contextlib.suppress(OSError):  # gone after the last frame: fine
                await _send_body(send, b"", more_body=False)

    async def _stream(self, receive: Receive, send: Send) -> Frames | None:
        """Attach the generation to a buffer and write it; stop when told to.

        The request's own task writes; ``DisconnectRace`` stops it when the
        client leaves, the buffer overflows or a write is stuck. The deadlines
        and the shutdown come as a ``Fail`` through the buffer. Over a
        ``ChunkedBodySend``, the frames that end the stream are not written
        but returned, for ``end_with``; else ``None``.
        """
        limit = self._limits.max_buffer_bytes
        with DisconnectRace(receive) as race:
            overflow = functools.partial(race.stop, f"over {limit} buffered bytes")
            buffer = stream_buffer(limit, overflow, self._limits.interval_tokens)
            with attached(self._generation, buffer, self._live, self._limits):
                last = await self._write(buffer, send, race)
        if race.reason is None:
            return last
        self._machine.write_failed()
        if race.reason != CLIENT_GONE and self._machine.outcome is EndState.ABORTED:
            header_id = self._machine.header.id
            logger.warning("stream %s: %s; aborted", header_id, race.reason)
            self._live.aborted_slow += 1
        return None

    async def _write(
        self, buffer: StreamBuffer, send: Send, race: DisconnectRace
    ) -> Frames | None:
        """Pump ``buffer``'s events through the machine to ``send`` until the
        machine ends (``pump.py``); heartbeat on silence.

        Runs once per token per stream, so it holds no per-write timer: one
        ``WriteWatch`` timer per stream checks for silence and stuck writes.
        Without pacing, events may be written from the engine's callback while
        the pump waits (``eager``); the pump settles whatever that started.
        """
        limits = self._limits
        clock = limits.clock or asyncio.get_running_loop()
        stuck = functools.partial(
            race.stop, f"the client accepted no byte for {limits.stuck_timeout_s:g} s"
        )
        watch = WriteWatch(
            limits.heartbeat_interval_s,
            limits.stuck_timeout_s,
            buffer.poke,
            stuck,
            clock,
        )
        sink = FrameSink(
            body_writes(send),
            watch,
            on_pending=buffer.poke,
            now=body_writes_now(send),
        )
        source = EventFrames(
            self._machine,
            buffer,
            sink,
            clock,
            watch=watch,
            eager=type(self).eager,
            interval_s=limits.interval_s,
            cadence_s=limits.cadence_s,
            on_heartbeat=self._live.count_heartbeat,
            hold_last=isinstance(send, ChunkedBodySend),
        )
        try:
            if await pump(source, sink):
                return source.last
            return None
        finally:
            source.close()
            sink.close()
            watch.cancel()

    async def _send_error(self, send: Send) -> None:
        # The details stay in the log: they may be internal.
        machine = self._machine
        fail = Fail(
            "The server failed while streaming this response", code="internal_error"
        )
        try:
            frames = machine.feed(fail)
        except LocalProtocolError:
            return  # the machine had ended: its outcome is what was written
        try:
            await _send_body(send, b"".join(frames))
        except OSError:
            machine.write_failed()
            return
        machine.wrote()


async def _send_body(send: Send, body: bytes, *, more_body: bool = True) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more_body})
