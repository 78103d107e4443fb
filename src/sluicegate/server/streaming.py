"""The two ASGI responses of a generation, each raced against the client leaving.

This is the only module that watches for ``http.disconnect``. ``EventStreamResponse``
writes an SSE stream; ``CompletionResponse`` waits for the whole answer and writes
one JSON body. In both, one task reads the engine (``Generation.run``), one writes,
and one awaits ``receive()``: when the client disconnects, the task group is
cancelled and every engine sequence still running is aborted, whether the request
is queued, in prefill or decoding.

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
    - Each response reports its end (``EndState`` and HTTP status) exactly once,
      through ``on_end``, after the engine sequences were aborted or ended.

Spec: ../shared/DESIGN.md, "The wire", "Status first, errors in band" and "Every
stream ends in exactly one state"; WHATWG HTML, "9.2 Server-sent events".
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
from starlette.types import Message, Receive, Scope, Send

from sluicegate.core.chunks import (
    Endpoint,
    ResponseHeader,
    chat_completion,
    dumps,
    error_payload,
    text_completion,
)
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineUnavailable, LocalProtocolError
from sluicegate.core.events import Delta, End, Fail, Heartbeat
from sluicegate.core.stream import StreamMachine
from sluicegate.server.generation import Generation, Outbox

__all__ = [
    "CLIENT_CLOSED",
    "SSE_HEADERS",
    "CompletionResponse",
    "EventStreamResponse",
    "OnEnd",
]

logger = logging.getLogger(__name__)

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"connection", b"keep-alive"),
]
"""Headers of every event stream (no ``Content-Length``, no ``Content-Encoding``)."""

CLIENT_CLOSED = 499
"""The status recorded when the client left before any status was sent (nginx's
convention; it never goes on the wire)."""

OnEnd = Callable[[EndState, int], None]
"""Called once when a response ends: its ``EndState`` and the HTTP status sent."""

_T = TypeVar("_T")


class _Gone:
    """The client disconnected before the work ended."""


_GONE = _Gone()


async def _race_disconnect(
    receive: Receive, work: Callable[[], Awaitable[_T]]
) -> _T | _Gone:
    """Run ``work`` until it returns, or until the client disconnects (``_GONE``)."""
    result: _T | _Gone = _GONE

    async def watch(scope: anyio.CancelScope) -> None:
        while True:
            message: Message = await receive()
            if message["type"] == "http.disconnect":
                scope.cancel()
                return

    async def run(scope: anyio.CancelScope) -> None:
        nonlocal result
        result = await work()
        scope.cancel()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        tg.start_soon(run, tg.cancel_scope)
    return result


async def _send_body(send: Send, body: bytes, *, more_body: bool = True) -> None:
    await send({"type": "http.response.body", "body": body, "more_body": more_body})


class EventStreamResponse:
    """An ASGI app that streams one generation as OpenAI chunks over SSE.

    Args:
        generation: already ``start()``-ed, so that a full engine queue was a 503
            before any byte.
        header: what every chunk shares (id, created, model, ``n``, usage option).
        heartbeat_interval_s: seconds of silence before a ``: keep-alive`` comment.
        on_end: told the end state (finished, errored or aborted) and status 200.

    Spec: OpenAI API reference, "Create chat completion", ``stream``.
    """

    def __init__(
        self,
        generation: Generation,
        header: ResponseHeader,
        heartbeat_interval_s: float,
        on_end: OnEnd,
    ) -> None:
        self._generation = generation
        self._machine = StreamMachine(header)
        self._heartbeat_interval_s = heartbeat_interval_s
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Write the stream until it ends, errs, or the client leaves."""
        state = EndState.ABORTED
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
            )
            await _send_body(send, b"".join(self._machine.start()))
            state = await self._stream(receive, send)
        except anyio.get_cancelled_exc_class():
            raise
        except OSError:
            state = EndState.ABORTED  # the connection broke before the stream began
        except Exception:  # the outermost frame: log, then one error event
            logger.exception("stream %s failed", self._machine.header.id)
            state = await self._send_error(send)
        finally:
            self._generation.abort_unfinished()
            self._on_end(state, 200)
        if state is not EndState.ABORTED:
            with contextlib.suppress(OSError):  # gone after the last frame: fine
                await _send_body(send, b"", more_body=False)

    async def _stream(self, receive: Receive, send: Send) -> EndState:
        async def pump() -> EndState:
            outbox = Outbox()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._generation.run, outbox)
                state = await self._write(outbox, send)
                tg.cancel_scope.cancel()
            return state

        result = await _race_disconnect(receive, pump)
        return EndState.ABORTED if isinstance(result, _Gone) else result

    async def _write(self, outbox: Outbox, send: Send) -> EndState:
        """Drain ``outbox`` into frames until the machine ends; heartbeat on silence."""
        machine = self._machine
        interval = self._heartbeat_interval_s
        last_write = anyio.current_time()
        while True:
            await outbox.wait(last_write + interval - anyio.current_time())
            events = outbox.drain() or [Heartbeat()]
            frames: list[bytes] = []
            for event in events:
                frames += machine.feed(event)
                if machine.end_state is not None:
                    break
            if frames:
                try:
                    await _send_body(send, b"".join(frames))
                except OSError:  # the connection broke: the client is gone
                    return EndState.ABORTED
                last_write = anyio.current_time()
            if machine.end_state is not None:
                return machine.end_state

    async def _send_error(self, send: Send) -> EndState:
        # The details stay in the log: they may be internal.
        fail = Fail(
            "The server failed while streaming this response", code="internal_error"
        )
        try:
            frames = self._machine.feed(fail)
        except LocalProtocolError:
            return self._machine.end_state or EndState.ERRORED
        try:
            await _send_body(send, b"".join(frames))
        except OSError:
            return EndState.ABORTED
        return EndState.ERRORED


class CompletionResponse:
    """An ASGI app that waits for the whole generation and sends one JSON body.

    The client's disconnect is watched while waiting: it aborts the engine,
    nothing is sent, and ``on_end`` gets ``CLIENT_CLOSED``. An engine failure
    (nothing sent yet) becomes a 503 for ``EngineUnavailable``, else a 500, in the
    OpenAI error shape.

    Args:
        generation: already ``start()``-ed.
        header: id, created, model and endpoint of the response.
        on_end: told the end state (finished, errored or aborted) and the status.

    Spec: OpenAI API reference, "The chat completion object", "The completion
    object".
    """

    def __init__(
        self, generation: Generation, header: ResponseHeader, on_end: OnEnd
    ) -> None:
        self._generation = generation
        self._header = header
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Generate, then send ``chat.completion``/``text_completion`` JSON."""
        # Until set below: a bug escaped, and Starlette answers 500.
        state, status = EndState.ERRORED, 500
        try:
            result = await _race_disconnect(receive, self._collect)
            if isinstance(result, _Gone):
                state, status = EndState.ABORTED, CLIENT_CLOSED
                return
            texts, fail = result
            if fail is None:
                state, status, body = EndState.FINISHED, 200, self._payload(texts)
            else:
                state, status = EndState.ERRORED, _status_of(fail)
                body = error_payload(fail.message, fail.type, None, fail.code)
            await _send_json(send, status, body)
        except OSError:
            state = EndState.ABORTED  # the status went out (or not); the body did not
        finally:
            self._generation.abort_unfinished()
            self._on_end(state, status)

    async def _collect(self) -> tuple[list[str], Fail | None]:
        texts = [""] * self._header.n
        outbox = Outbox()
        end: End | Fail | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._generation.run, outbox)
            while end is None:
                await outbox.wait(math.inf)
                for event in outbox.drain():
                    if isinstance(event, Delta):
                        texts[event.index] += event.text
                    elif isinstance(event, End | Fail):
                        end = event
                        break
            tg.cancel_scope.cancel()
        return texts, end if isinstance(end, Fail) else None

    def _payload(self, texts: list[str]) -> dict[str, Any]:
        choices = list(zip(texts, self._generation.finish_reasons, strict=True))
        usage = self._generation.usage
        if self._header.endpoint is Endpoint.CHAT:
            return chat_completion(self._header, choices, usage)
        return text_completion(self._header, choices, usage)


def _status_of(fail: Fail) -> int:
    return 503 if fail.code == EngineUnavailable.code else 500


async def _send_json(send: Send, status: int, payload: dict[str, Any]) -> None:
    body = dumps(payload)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await _send_body(send, body, more_body=False)
