"""What the two responses of a generation share: limits, error codes, and the body.

A generation is answered by one of two ASGI apps: ``EventStreamResponse``
(``sse_response.py``) writes an SSE stream, ``CompletionResponse``
(``json_response.py``) waits for the whole answer and writes one JSON body. In
both, ``Generation.attach`` decodes the engine's outputs into a ``StreamBuffer``
as they come (``attached`` here, which also arms the deadlines), the request's
own task drains it, and ``DisconnectRace`` (``disconnect.py``, the only place
that watches for ``http.disconnect``) stops that task when the client leaves;
every engine sequence still running is then aborted, whether the request is
queued, in prefill or decoding.

The stream's writing is split by job: ``WriteWatch`` (``write_watch.py``) times
heartbeats and stuck writes, a ``FrameSink`` (``sink.py``) writes frames, and
the pump (``pump.py``) moves the frames that ``StreamMachine`` returns to the
sink and reports each write's outcome back to it; the machine alone decides
the end state and the closing frames.

Invariants:
    - Each response reports its end (``EndState`` and HTTP status) exactly once,
      through ``OnEnd``, after the engine sequences were aborted or ended.
    - Timeouts (first token, total) and the shutdown grace period put one
      ``Fail`` into the buffer: an in-band error for a stream, a 503/504 JSON
      error for a non-streaming response (``errors.STATUS_OF_CODE``).
    - The engine and other streams never wait on one client: the buffer never
      blocks, and a stream over its byte bound or stuck on a write is aborted.

Spec: docs/DESIGN.md, "The wire", "Status first, errors in band", "End states"
and "Timeouts".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sluicegate.core.endstate import EndState
from sluicegate.core.events import Fail
from sluicegate.engines.clocks import Timer, Timers
from sluicegate.server.http.errors import FIRST_TOKEN_TIMEOUT, REQUEST_TIMEOUT
from sluicegate.server.streaming.buffer import LiveStreams, StreamBuffer
from sluicegate.server.streaming.generation import Generation

__all__ = [
    "OnEnd",
    "StreamLimits",
    "arm_deadlines",
    "attached",
]


OnEnd = Callable[[EndState, int], None]
"""Called once when a response ends: its ``EndState`` and the HTTP status sent."""


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
        cadence_s: write an event stream on a clock of this period (seconds;
            0: off): each tick writes what came since the last, coalesced, or
            one empty (padded) event when nothing did; ``interval_s`` is then
            not used.
        interval_tokens: write a stream's content every this many deltas
            (tokens; the first at once, see ``buffer.TokenBatches``); 1: as
            they come.
        clock: what the stream's timers run on (heartbeats, stuck writes,
            pacing, the cadence, the first-token and request deadlines);
            ``None``: the running event loop. Tests step a ``ManualClock``.
    """

    heartbeat_interval_s: float = 15.0
    first_token_timeout_s: float | None = None
    request_timeout_s: float | None = None
    max_buffer_bytes: int = 1 << 20
    stuck_timeout_s: float = 30.0
    interval_s: float = 0.0
    cadence_s: float = 0.0
    interval_tokens: int = 1
    clock: Timers | None = None


@contextlib.contextmanager
def attached(
    generation: Generation,
    buffer: StreamBuffer,
    live: LiveStreams,
    limits: StreamLimits,
) -> Iterator[None]:
    """For the body: ``buffer`` registered in ``live`` (the graceful drain puts
    its ``Fail`` there), the deadlines of ``limits`` armed on it, and
    ``generation`` attached to it; all undone after, whatever ends the body."""
    live.open(buffer)
    deadlines = arm_deadlines(generation, buffer, limits)
    try:
        generation.attach(buffer)
        yield
    finally:
        for timer in deadlines:
            timer.cancel()
        generation.detach()
        live.close(buffer)


def arm_deadlines(
    generation: Generation, buffer: StreamBuffer, limits: StreamLimits
) -> list[Timer]:
    """Timers that put a timeout ``Fail`` into ``buffer`` when a limit runs out,
    on ``limits.clock`` (seconds from now).

    Returns:
        The armed timers (none without limits); cancel each when the body ends.
    """
    clock = limits.clock or asyncio.get_running_loop()
    now = clock.time()
    first, total = limits.first_token_timeout_s, limits.request_timeout_s
    timers: list[Timer] = []

    def first_token_due() -> None:
        if generation.first_token_at is None:
            message = f"No token was generated within {first:g} s"
            buffer.put(Fail(message, code=FIRST_TOKEN_TIMEOUT))

    def request_due() -> None:
        message = f"The request did not complete within {total:g} s"
        buffer.put(Fail(message, code=REQUEST_TIMEOUT))

    if first is not None and (total is None or first < total):
        timers.append(clock.call_at(now + first, first_token_due))
    if total is not None:
        timers.append(clock.call_at(now + total, request_due))
    return timers
