"""One streamed response read: the stream iterates its deltas, resumes the
response when it is cut, and gives its ``StreamResult``.

The client (``aio.py``) makes these. ``client/stream_aio.py`` is written by hand;
``client/stream_sync.py`` is generated from it by ``scripts/unasync.py``, as
``client/sync.py`` is from ``client/aio.py``.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Self

import httpx

from sluicegate.client import shell
from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.assemble_events import EventApi, EventStreamAssembler
from sluicegate.client.results import StreamResult, TextDelta, TimeoutKind
from sluicegate.client.shell import Ending, Resumption, Timeouts, capture, resume_path
from sluicegate.core.errors import StreamClosed, StreamConsumed

__all__ = ["AsyncStream"]


class WithBlock:
    """Closed by ``aclose()`` when its ``async with`` block ends."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class AsyncStream(WithBlock):
    """One streaming response: iterate it for text deltas, then ask for ``aresult()``.

    Nothing is sent until the stream is first iterated or ``aresult()`` is called.
    Iterate it at most once (``StreamConsumed`` otherwise); ``aclose()`` stops
    reading and closes the connection, so that the server aborts the request (a
    resumable one once its grace period ends).

    A stream whose events carry ``id:`` lines (a resumable one) that loses its
    connection before its end is resumed (``resumption``): the deltas go on
    where they stopped, each exactly once, as if nothing happened, and
    ``StreamResult.resumes`` counts the resumes.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        request: httpx.Request,
        n: int,
        timeouts: Timeouts,
        record: bool,
        resumption: Resumption | None = None,
        api: EventApi | None = None,
    ) -> None:
        self._http = http
        self._request = request
        self._timeouts = timeouts
        self._resumption = resumption or Resumption()
        self._assembler: StreamAssembler | EventStreamAssembler = (
            StreamAssembler(n, record=record)
            if api is None
            else EventStreamAssembler(api, record=record)
        )
        self._gen: AsyncGenerator[TextDelta, None] = self._run()
        self._iterated = False
        self._result: StreamResult | None = None
        self._interrupted = False
        self._socket: socket.socket | None = None

    def __aiter__(self) -> AsyncIterator[TextDelta]:
        """The non-empty text deltas of every choice, in wire order.

        Raises:
            StreamConsumed: iterated before.
            StreamClosed: the stream was closed or fully read already.
        """
        if self._result is not None:
            raise StreamClosed()
        if self._iterated:
            raise StreamConsumed()
        self._iterated = True
        return self._gen

    async def aresult(self) -> StreamResult:
        """Read whatever is left (sending the request if need be); the outcome.

        Returns:
            The stream's ``StreamResult``; the same object on every call. After
            ``aclose()`` of an unfinished stream its end state is ``aborted``.
        """
        if self._result is None:
            self._iterated = True
            async for _ in self._gen:
                pass
        assert self._result is not None  # set by _run's finally
        return self._result

    async def aclose(self) -> None:
        """Stop reading and close the connection; idempotent.

        An unfinished stream ends ``aborted``; one never started is not sent.
        """
        await self._gen.aclose()
        if self._result is None:  # closed before the request was sent
            self._result = self._assembler.flush(0.0, client_gone=True)

    def interrupt(self) -> None:
        """Give the stream up from a signal handler (or another thread).

        The connection's socket is shut down, so a read in progress returns at
        once and the stream ends ``aborted``, as after ``aclose()``. Unlike an
        exception raised wherever the handler happens to run (Ctrl-C's
        ``KeyboardInterrupt``), this never interrupts the HTTP library halfway
        through its own bookkeeping: it sees a connection closed under it. Before
        the response's head has arrived only a flag is set, read when it does.
        """
        self._interrupted = True
        sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):  # closed already
                sock.shutdown(socket.SHUT_RDWR)

    async def _run(self) -> AsyncGenerator[TextDelta, None]:
        start = time.monotonic()
        ending = Ending()
        request: httpx.Request | None = self._request
        try:
            while request is not None:
                attempt = self._attempt(request, ending, start)
                try:
                    async for delta in attempt:
                        yield delta
                finally:  # closed now, so that ``ending`` is complete
                    await attempt.aclose()
                request = await self._next(ending)
                if request is not None:
                    ending = Ending()
        finally:
            self._result = self._assembler.flush(
                time.monotonic() - start,
                client_gone=ending.client_gone,
                timeout=ending.timeout,
                transport_error=ending.transport_error,
            )
            if ending.client_gone:
                await self._cancel()

    async def _cancel(self) -> None:
        """Cancel a resumable stream the caller gave up on (best effort)."""
        cursor = self._assembler.unended_id
        if cursor is None:
            return
        path = self._request.url.path.rstrip("/").rpartition("/v1/")[2]
        with contextlib.suppress(httpx.HTTPError):  # the server is gone: nothing
            await self._http.post(resume_path(path, cursor, "cancel"), timeout=2.0)

    async def _next(self, ending: Ending) -> httpx.Request | None:
        """The resume request after a dropped connection, or ``None`` (ended)."""
        resumes = self._assembler.resumes
        if (
            ending.transport_error is None
            or ending.client_gone
            or self._interrupted
            or resumes >= self._resumption.max_resumes
        ):
            return None
        cursor = self._assembler.resume()
        if cursor is None:
            return None
        await shell.asleep(self._resumption.delay_s(resumes))
        path = self._request.url.path.rstrip("/").rpartition("/v1/")[2]
        headers = {"Last-Event-ID": cursor, "Accept": "text/event-stream"}
        return self._http.build_request(
            "GET", resume_path(path, cursor), headers=headers
        )

    async def _attempt(
        self, request: httpx.Request, ending: Ending, start: float
    ) -> AsyncGenerator[TextDelta, None]:
        """Send ``request`` and feed its body; ``ending`` says how it ended."""
        response: httpx.Response | None = None
        first = request is self._request
        try:
            with capture(ending):
                response = await self._http.send(request, stream=True)
                ending.headed = True
                elapsed = time.monotonic() - start
                if first:
                    status, headers = response.status_code, response.headers
                    self._assembler.head(status, headers, elapsed)
                elif response.status_code != 200:  # the log is gone: stop here
                    return
                self._socket = _socket_of(response)
                if self._interrupted:  # before the head came: nothing to read
                    return
                timeouts = response.request.extensions["timeout"]  # read per body
                timeouts["read"] = self._timeouts.body_read_s(elapsed)
                async for data in response.aiter_bytes():
                    elapsed = time.monotonic() - start
                    for delta in self._assembler.feed(data, elapsed):
                        yield delta
                    if self._assembler.stopped or self._interrupted:
                        break
                    if self._timeouts.over_total(elapsed):
                        ending.timeout = TimeoutKind.TOTAL
                        break
        except BaseException:  # closed, Ctrl-C, cancelled: the client gave up
            ending.client_gone = True
            raise
        finally:
            self._socket = None
            if self._interrupted:  # the shut-down socket is not a transport error
                ending.client_gone = True
                ending.transport_error = None
            if response is not None:
                await response.aclose()


def _socket_of(response: httpx.Response) -> socket.socket | None:
    """The socket under ``response``'s connection (``None`` for a mock transport)."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    return sock if isinstance(sock, socket.socket) else None
