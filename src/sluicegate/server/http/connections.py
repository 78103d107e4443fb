"""HTTP connection limits: uvicorn's h11 protocol with read deadlines, a 431 and a cap.

``serve`` runs uvicorn with ``http=protocol_class(limits, on_refuse)``, a
subclass of uvicorn's ``H11Protocol``, and sets uvicorn's own limits beside it
(``options.run_server``): ``h11_max_incomplete_event_size`` (the request head) and
``timeout_keep_alive``. What uvicorn has no setting for is a time limit on reading
a request, so a client can hold a connection (and, before this module, its
buffered head) for as long as it likes by sending nothing, or one byte every few
seconds. Here each connection has one timer:

- a request's head (request line and headers) must be complete within
  ``header_timeout_s``, counted from the connection's opening for its first
  request and from the first byte of each later one (between requests, uvicorn's
  keep-alive timeout closes an idle connection);
- its body, within ``body_timeout_s`` of the end of its head.

Past a deadline the connection gets ``408 Request Timeout`` (an OpenAI error
body, ``Connection: close``), unless a response to that request has begun or a
later request has not sent a byte yet, and is closed. A request read in full
stops the timer: a response may stream for as long as it likes. A head over
h11's size limit gets ``431 Request Header Fields Too Large`` (uvicorn answers
every parse error with 400) and a close.

The connection cap is here too, not uvicorn's ``limit_concurrency``: a request on
a connection past ``max_connections`` gets ``503`` with ``Retry-After`` and an
OpenAI error body (code ``too_many_connections``) and a close, where uvicorn's
own is a plain-text 503 without ``Retry-After``. Each of these refusals (408, 431,
503) is reported to ``on_refuse`` with its code (``REFUSAL_CODES``): the app
counts them in its metrics, as it does its own refusals before routing; none
has a ledger row, since no request reached the app.

Invariants:
    - At most one timer per connection; it is re-armed only when the phase
      changes (head -> body -> done), so trickling bytes never extend a deadline.
    - The phase is read from ``h11.Connection.their_state`` after uvicorn has
      fed the bytes in, never guessed from the bytes.

Why h11 and not httptools (which ``uvicorn[standard]`` picks by default):
uvicorn's httptools protocol bounds neither a header's size nor the head's (a
32 MB header was accepted), and frames every response without a length as
chunked, HTTP/1.0 peers included (RFC 9112 forbids it); h11 stops buffering a
head at its limit and delimits an HTTP/1.0 response by closing the connection.
Its per-write work is skipped where it adds nothing (``chunked_body.py``).

Spec: RFC 9110, "15.5.9. 408 Request Timeout"; RFC 6585, "5. 431 Request Header
Fields Too Large"; RFC 9112, "6.3. Message Body Length", "7.1. Chunked Transfer
Coding" and "9.6. Tear-down".
"""

from __future__ import annotations

import asyncio
import enum
import logging
import re
import resource
import sys
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

from sluicegate.core.wire.chunks import dumps, error_payload
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.http.answers import describe, error_answer
from sluicegate.server.http.chunked_body import ChunkedBodySend
from sluicegate.server.http.errors import (
    HeadTooLarge,
    RequestTimeout,
    TooManyConnections,
)

__all__ = [
    "DEFAULT_MAX_CONNECTIONS",
    "REFUSAL_CODES",
    "UVICORN_BACKLOG",
    "ConnectionLimits",
    "LimitedH11Protocol",
    "default_max_connections",
    "protocol_class",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 4096
"""The connection cap when the open-file limit leaves room for it."""

UVICORN_BACKLOG = 2048
"""uvicorn's default listen backlog: the least ``ConnectionLimits.backlog``."""

REFUSAL_CODES = ("request_timeout", "request_header_too_large", "too_many_connections")
"""Every ``code`` that ``on_refuse`` is given."""

_RESERVED_FDS = 64
"""File descriptors kept out of the connection cap: the listening socket, the
ledger, the model file, logs and the engine's own."""


def default_max_connections() -> int:
    """``DEFAULT_MAX_CONNECTIONS``, or fewer: the open-file limit minus 64.

    Past the process's file-descriptor limit ``accept()`` fails and clients see
    resets; under the cap, a connection over it gets uvicorn's 503 instead.
    """
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft - _RESERVED_FDS))


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a connection may take to send a request, and its head's size.

    Attributes:
        header_timeout_s: seconds for a request's head to arrive in full (> 0).
        body_timeout_s: seconds for its body, from the end of its head (> 0).
        max_header_bytes: the largest request head, in bytes (request line and
            headers; > 0); the same value goes to uvicorn as
            ``h11_max_incomplete_event_size``, and this one names it in the 431.
        max_connections: connections served at once (> 0); a request on one more
            gets 503. ``None``: no cap.
        retry_after_s: the ``Retry-After`` of that 503, in seconds (>= 0).
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_header_bytes: int = 32 * 1024
    max_connections: int | None = None
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_header_bytes"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        if self.max_connections is not None and self.max_connections <= 0:
            raise ValueError(
                f"max_connections must be > 0, got {self.max_connections!r}"
            )
        if self.retry_after_s < 0:
            raise ValueError(f"retry_after_s must be >= 0, got {self.retry_after_s!r}")

    @property
    def backlog(self) -> int:
        """The listen queue's length: ``max_connections``, at least uvicorn's
        default 2,048 (the kernel caps it at ``net.core.somaxconn``).

        A ramp of new streams while the core is busy waits there (1,874 deep
        at 2,000 streams, full at 2,600); one past a full queue loses its
        handshake and waits for TCP's retry, 1 s, then 2 s and 4 s more.
        """
        return max(UVICORN_BACKLOG, self.max_connections or 0)


class _Phase(enum.Enum):
    """What a connection is waiting for from its client."""

    IDLE = "idle"  # between requests: uvicorn's keep-alive timeout applies
    HEAD = "head"
    BODY = "body"
    DONE = "done"  # the request is read; the response takes its time


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with head and body deadlines, a 431 and a JSON 503.

    Use ``protocol_class(limits, on_refuse)``: uvicorn instantiates the class
    itself, so the limits are class attributes.
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    on_refuse: ClassVar[Callable[[str], None] | None] = None
    timers: ClassVar[Timers | None] = None  # the read deadlines' clock; None: the loop

    _phase: _Phase
    _deadline: Deadline | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # uvicorn runs ``self.app`` for each request it parses: the cap is checked
        # then, as uvicorn's own ``limit_concurrency`` is.
        self._served_app = self.app
        self.app = self._capped_app

    async def _capped_app(self, scope: Scope, receive: Receive, send: Send) -> None:
        cap = self.limits.max_connections
        if cap is None or len(self.connections) <= cap:
            cycle = getattr(send, "__self__", None)
            if isinstance(cycle, RequestResponseCycle):
                send = ChunkedBodySend(cycle, scope)
            await self._served_app(scope, receive, send)
            return
        logger.warning(
            "refused a request: %d connections open, %d served",
            len(self.connections),
            cap,
        )
        self._report("too_many_connections")
        answer = error_answer(TooManyConnections(cap), self.limits.retry_after_s)
        answer.headers["connection"] = "close"
        await answer(scope, receive, send)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._phase = _Phase.IDLE
        self._deadline = None
        self._enter(_Phase.HEAD)  # a new connection owes a request at once

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(_Phase.DONE)
        super().connection_lost(exc)
        # self.app is a method of this protocol: a reference cycle that only the
        # collector would free. A request still running holds its own app.
        self.app = self._served_app

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE and self._head_over_limit(data):
            self._enter(_Phase.DONE)
            self._refuse(HeadTooLarge(self.limits.max_header_bytes))
            return
        super().data_received(data)
        self._follow(bytes_arrived=True)

    def _head_over_limit(self, data: bytes) -> bool:
        """Whether the head that ``data`` completes is over the limit. h11's own
        limit counts only a head still incomplete after a read, so a whole
        head that came in one read is measured here."""
        limit = self.limits.max_header_bytes
        buffered = self.conn.trailing_data[0]
        if len(buffered) + len(data) <= limit:
            return False
        head = bytes(buffered) + data
        end = _HEAD_END.search(head)
        return end is not None and end.start() > limit

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow(bytes_arrived=False)

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this from inside its `except h11.RemoteProtocolError`, so
        # the error, and h11's status hint (431 for a head over the limit), is
        # the one being handled.
        exc = sys.exc_info()[1]
        if isinstance(exc, h11.RemoteProtocolError) and exc.error_status_hint == 431:
            self._enter(_Phase.DONE)
            self._refuse(HeadTooLarge(self.limits.max_header_bytes))
            return
        super().send_400_response(msg)

    def _follow(self, *, bytes_arrived: bool) -> None:
        """Move to the phase h11's view of the client's side says."""
        state = self.conn.their_state
        if state is h11.IDLE:
            # Bytes while idle are the start of a head (h11 has not parsed a
            # whole one yet); a head that was already due stays due.
            started = bytes_arrived or self._phase is _Phase.HEAD
            self._enter(_Phase.HEAD if started else _Phase.IDLE)
        elif state is h11.SEND_BODY:
            self._enter(_Phase.BODY)
        else:
            self._enter(_Phase.DONE)

    def _enter(self, phase: _Phase) -> None:
        if phase is self._phase:
            return
        self._phase = phase
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        limits = self.limits
        if phase is _Phase.HEAD or phase is _Phase.BODY:
            after_s = (
                limits.header_timeout_s
                if phase is _Phase.HEAD
                else limits.body_timeout_s
            )
            self._deadline = Deadline(self.timers or self.loop, after_s)
            self._deadline.call(self._expire)

    def _expire(self) -> None:
        self._deadline = None
        phase = self._phase
        self._phase = _Phase.DONE
        if self.transport.is_closing():
            return
        cycle: RequestResponseCycle | None = self.cycle
        # A head's cycle is the previous request's (done); a body's is its own,
        # which may already be answered (a 401 before the body was read).
        answered = phase is _Phase.BODY and cycle is not None and cycle.response_started
        # A later request that has sent nothing yet is an idle connection (uvicorn
        # stops its keep-alive timer on any byte, even the end of a body it
        # drained after answering): close it as the keep-alive timeout would.
        idle = phase is _Phase.HEAD and cycle is not None and not self._buffered()
        logger.debug("closing %s: its request %s was late", self.client, phase.value)
        if answered or idle:
            self.transport.close()
            return
        timeout_s = (
            self.limits.header_timeout_s
            if phase is _Phase.HEAD
            else self.limits.body_timeout_s
        )
        self._refuse(RequestTimeout(phase.value, timeout_s))

    def _buffered(self) -> bool:
        data, _ = self.conn.trailing_data
        return bool(data)

    def _report(self, code: str) -> None:
        on_refuse = type(self).on_refuse
        if on_refuse is not None:
            on_refuse(code)

    def _refuse(self, exc: RequestTimeout | HeadTooLarge) -> None:
        """Write one error response outside h11 (the connection ends), close."""
        answer = describe(exc)
        status, code = answer.status, answer.code
        assert code is not None, "both errors carry their code"
        self._report(code)
        body = dumps(error_payload(answer.message, answer.error_type, None, code))
        reason = HTTPStatus(status).phrase
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


_HEAD_END = re.compile(rb"\r?\n\r?\n")  # the blank line that ends a head


def protocol_class(
    limits: ConnectionLimits,
    on_refuse: Callable[[str], None] | None = None,
    timers: Timers | None = None,
) -> type[LimitedH11Protocol]:
    """The protocol class to give uvicorn as ``Config(http=...)``.

    Args:
        limits: the connection limits.
        on_refuse: called on the event loop with the code (``REFUSAL_CODES``) of
            each 408, 431 and 503 the protocol answers itself; ``None``: not
            reported.
        timers: the clock of the head and body deadlines; ``None``: the loop.
    """

    class ConfiguredH11Protocol(LimitedH11Protocol):
        pass

    ConfiguredH11Protocol.limits = limits
    ConfiguredH11Protocol.on_refuse = on_refuse  # read from the class: never bound
    ConfiguredH11Protocol.timers = timers
    return ConfiguredH11Protocol
