"""Chunked body parts framed here, not by h11: the same bytes, less work per token.

h11's own per-write work in Python (about 6 us more per ``send`` than
httptools on this project's machine, paid once per token of each stream) is
skipped where it adds nothing: once a response's head went out with chunked
framing (an HTTP/1.1 peer, no ``Content-Length``, a status with a body, not
``HEAD``), each body part that is not the last is framed here, as h11's chunked
writer would (``%x CRLF data CRLF``), and written to the transport
(``ChunkedBodySend``); everything else (the head, the last part, HTTP/1.0
peers, a paused or gone transport) goes through uvicorn's ``send`` as before.
h11 keeps no count of chunked data, so its state stays the same.

``ChunkedBodySend.write_now`` is the same write without a coroutine: a frame
sink (``server/streaming/sink.py``) calls it once per token per stream, and
falls back to ``send`` when it says it cannot write now.
``ChunkedBodySend.start_with`` sends a response's head and its first body part
in one transport write (uvicorn's bytes for the head, h11's state as after
its own write): one system call less per stream, at its start.
``ChunkedBodySend.end_with`` is its mirror at the end: the last body part and
the body's end (``0 CRLF CRLF``, h11's bytes for a chunked body without
trailers) in one write, then uvicorn's own ``send`` of the end, whose bytes
are already out (its state, its close and its next request as after its own
write): one system call less per stream, at its end.

Spec: RFC 9112, "7.1. Chunked Transfer Coding".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h11
from starlette.types import Scope, Send
from uvicorn.protocols.http.h11_impl import RequestResponseCycle

__all__ = ["ChunkedBodySend"]


_BODYLESS_STATUSES = frozenset({204, 304})


class ChunkedBodySend:
    """uvicorn's h11 ``send`` for one response, with chunked body parts framed
    here (see the module doc): the same bytes on the wire, without h11's work.

    Args:
        cycle: uvicorn's request-response cycle, whose ``send`` this wraps.
        scope: the request's ASGI scope (its ``method``).
    """

    __slots__ = ("_chunked", "_cycle", "_head", "_send")

    def __init__(self, cycle: RequestResponseCycle, scope: Scope) -> None:
        self._cycle = cycle
        self._send = cycle.send
        self._head = scope.get("method") == "HEAD"
        self._chunked = False  # the head went out with chunked framing

    async def __call__(self, message: Any) -> None:
        """``send(message)``: a body part that is not the last is written at once
        when the response is chunked and the transport takes writes."""
        if (
            message["type"] != "http.response.body"
            or not message.get("more_body", False)
            or not self.write_now((message.get("body", b""),))
        ):
            await self._send(message)
        if message["type"] == "http.response.start":
            self._chunked = self._frames_chunks(message)

    async def start_with(self, start: Send, message: Any, body: bytes) -> None:
        """``start(message)`` (the response's head, through whatever wraps this
        ``send``), then ``body`` as a body part that is not the last: in one
        transport write when the response is chunked and the transport takes
        writes; otherwise as two sends. The same bytes either way.

        Args:
            start: the app's ``send`` (this one, maybe wrapped by middleware).
            message: the ``http.response.start`` message.
            body: the first body part (``b""``: the head alone).

        Raises:
            Exception: what ``start`` or the transport's ``write`` raises.
        """
        cycle = self._cycle
        if not body or cycle.flow.write_paused or cycle.disconnected:
            await start(message)
            await self({"type": "http.response.body", "body": body, "more_body": True})
            return
        transport = cycle.transport
        held = _HeldWrites()
        # The head's write only: with the transport not paused, the send does
        # not wait, so nothing else writes meanwhile.
        cycle.transport = held  # type: ignore[assignment]
        try:
            await start(message)
        finally:
            cycle.transport = transport
        head = b"".join(held.parts)
        if self._chunked and not cycle.response_complete:
            transport.write(b"%b%x\r\n%b\r\n" % (head, len(body), body))
            return
        if head:
            transport.write(head)
        await self({"type": "http.response.body", "body": body, "more_body": True})

    async def end_with(self, body: bytes) -> None:
        """``body`` as a body part, then the body's end: in one transport write
        when the response is chunked and the transport takes writes;
        otherwise as two sends. The same bytes either way.

        Args:
            body: the last body part (``b""``: the end alone).

        Raises:
            Exception: what the transport's ``write`` or ``send`` raises.
        """
        cycle = self._cycle
        end: Any = {"type": "http.response.body", "body": b"", "more_body": False}
        if not body or not self._writable():
            if body:
                await self(
                    {"type": "http.response.body", "body": body, "more_body": True}
                )
            await self._send(end)
            return
        transport = cycle.transport
        transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body))
        # uvicorn's send of the end: h11's state moves and the connection
        # closes or takes its next request as after its own write; the bytes
        # it writes (h11's, the end written above) are dropped.
        cycle.transport = _WrittenEnd(transport)  # type: ignore[assignment]
        try:
            await self._send(end)
        finally:
            cycle.transport = transport

    def write_now(self, parts: Sequence[bytes]) -> bool:
        """Write ``parts``, joined, as one body part that is not the last, now:
        when the response is chunked and the transport takes writes (not
        paused, not gone, the response not complete). An empty part writes
        nothing (it would end the body).

        Returns:
            False when it cannot write now: nothing was written, and the part
            goes through ``send`` (``__call__``), which may wait.

        Raises:
            Exception: what the transport's ``write`` raises.
        """
        if not self._writable():
            return False
        cycle = self._cycle
        if len(parts) == 1:
            body = parts[0]
            if body:
                cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            return True
        size = sum(map(len, parts))
        if size:
            cycle.transport.write(b"".join((b"%x\r\n" % size, *parts, b"\r\n")))
        return True

    def _writable(self) -> bool:
        """Whether a body part may be framed here and written now: chunked,
        the transport not paused, not gone, the response not complete."""
        cycle = self._cycle
        return (
            self._chunked
            and not cycle.flow.write_paused
            and not cycle.disconnected
            and not cycle.response_complete
        )

    def _frames_chunks(self, start: Any) -> bool:
        """Whether h11 framed the response that ``start`` began as chunked."""
        status = start["status"]
        if self._head or status < 200 or status in _BODYLESS_STATUSES:
            return False
        version = self._cycle.conn.their_http_version
        if version is None or version < b"1.1":
            return False  # HTTP/1.0: delimited by closing the connection
        if self._cycle.conn.our_state is not h11.SEND_BODY:
            return False
        for name, _ in start.get("headers", ()):
            if name.lower() in (b"content-length", b"transfer-encoding"):
                return False
        return True


class _HeldWrites:
    """Stands for a transport while a response's head is sent: keeps what
    uvicorn writes, for ``start_with`` to write with the first body part."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.parts.append(bytes(data))


class _WrittenEnd:
    """Stands for a transport while uvicorn sends a body's end that
    ``end_with`` wrote already: drops what it writes; anything else (its
    close, should the send wait for a paused transport) is the transport's."""

    __slots__ = ("_transport",)

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
