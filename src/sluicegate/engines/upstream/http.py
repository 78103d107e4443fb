"""The HTTP hop to one upstream: a streamed POST, its body's bytes, its close.

``UpstreamEngine`` talks to each upstream through a ``HopClient``: ``post``
sends one request and returns once the response's head arrived, as a
``HopResponse`` (its status, its headers, an async iterator of its body's bytes
as they arrive, ``aclose()``); ``get_status`` is the health check's GET.
``AiohttpHop`` is the one implementation, a thin adapter over aiohttp's
``ClientSession``: its HTTP parser is compiled, and one read returns every body
byte that has arrived.

Why aiohttp and not httpx, which the hop also spoke until it was measured
against aiohttp on the same load (``bench/gateway.py``, docs/upstreams.md):
after the writes to its own clients, the client library is the largest share
of a gateway's CPU per token, and httpx hands each HTTP chunk up through h11
(pure Python) and a stack of async iterators; the hop cost 30-40% more CPU per
token over httpx, and at 200 streams on a busy machine httpx fell behind the
streams' rate where aiohttp kept up.

What the engine needs, and each adapter gives:

- one pool per upstream: at most its ``max_streams`` connections, and two for
  the health checks (requests past them wait for one), each kept alive between
  requests for ``KEEPALIVE_S``, below the five seconds that uvicorn-based
  servers (vLLM, SGLang, sluicegate) keep an idle connection, so a request
  rarely meets a connection the upstream is closing;
- the TCP connect limit ``connect_s``; the other limits of a stream (time to
  first token, idle time, total) are the engine's own timer, one per stream,
  re-armed when it fires: a timeout per read would cost a timer per chunk;
- the body as sent (``Accept-Encoding: identity``, no decompression, the
  chunked framing removed), split anywhere;
- ``aclose()`` of a body read to its end gives the connection back to the pool;
  of any other, closes it at once, which is how an upstream learns that its
  client left (and aborts its request);
- ``pour(feed)``, the fast twin of iterating the body: each piece goes to
  ``feed`` from the connection's own read callback as it arrives, so a stream's
  token costs no future, task step or chain of awaits (``read_stream``'s
  steady state; 6-8% of a gateway's CPU per token went to that round trip).
  Over aiohttp it stands in as the body reader's waiter (the one object
  aiohttp's reader wakes when bytes, a chunk's end, the body's end or an error
  arrive) and takes the bytes with the reader's own ``read_nowait``; the
  tests read every body both ways.

Errors: whatever the library raises for a failed exchange (no connection, a
reset, a malformed response, a body cut short) becomes ``HopError`` at the
adapter's edge (a response's head, its body's reads, a health check), or
``HopConnectError`` when no connection could be opened at all; its message
names the upstream (``UpstreamConfig.name``) and the library's exception class,
never the exception's text (a malformed status or header line, or a
``Location`` the library could not parse, may quote the key, whole or in
part). Cancellation passes through untouched.

Redirects are never followed: a 3xx is a response like any
other (``core/upstream/hop_answers.py`` makes it a 502). Following one would re-send the
request, with its ``Authorization``, to whatever host the upstream names (and
as a GET after a 301, 302 or 303).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Final, Protocol

import aiohttp

from sluicegate.core.errors import EngineError
from sluicegate.engines.upstream.config import UpstreamConfig

__all__ = [
    "KEEPALIVE_S",
    "AiohttpHop",
    "HopClient",
    "HopConnectError",
    "HopError",
    "HopResponse",
]

KEEPALIVE_S: Final = 4.0
"""How long an idle connection stays in a pool (seconds)."""


class HopError(EngineError):
    """The HTTP exchange with an upstream failed (no connection, a reset, a
    malformed response, a body cut short); the message names the upstream
    and the library's exception class."""


class HopConnectError(HopError):
    """No connection to the upstream could be opened (refused, no route, no
    such name, the connect time limit)."""


class HopResponse(Protocol):
    """One upstream response whose head has arrived."""

    @property
    def status(self) -> int:
        """The HTTP status code."""
        ...

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (lower case), or ``None``."""
        ...

    def __aiter__(self) -> HopResponse:
        """The body's bytes as they arrive; iterate it once (a loop may stop and
        another resume it)."""
        ...

    async def __anext__(self) -> bytes:
        """The next bytes of the body (never empty).

        Raises:
            StopAsyncIteration: the body ended.
            HopError: the body broke (a reset, bad chunked framing, cut short).
        """
        ...

    async def pour(self, feed: Callable[[bytes], bool]) -> bool:
        """Give each piece of the body to ``feed`` as it arrives, until
        ``feed`` returns ``False`` or the body ends; iteration may go on after.

        ``feed`` is called from the connection's read callback (no task switch
        per piece): first with what arrived before the call, then with each
        piece as it comes (never empty). It must not await or read the body.

        Returns:
            ``True`` when the body ended, ``False`` when ``feed`` stopped.

        Raises:
            HopError: the body broke.
            Exception: whatever ``feed`` raised, as it raised it (the body is
                not read further).
        """
        ...

    async def aclose(self) -> None:
        """Give the connection back (body read to its end) or close it (any
        other); idempotent."""
        ...


class HopClient(Protocol):
    """The connection pool to one upstream."""

    async def post(self, path: str, body: bytes) -> HopResponse:
        """POST ``body`` (JSON) to ``path`` (relative to the upstream's URL).

        Returns:
            The response once its head arrived; the caller ``aclose()``s it.

        Raises:
            HopError: no connection, or no response head.
        """
        ...

    async def get_status(self, path: str, timeout_s: float) -> int:
        """GET ``path`` (relative to the upstream's URL): its status.

        Raises:
            HopError: no answer within ``timeout_s`` seconds.
        """
        ...

    async def aclose(self) -> None:
        """Close every connection of the pool."""
        ...


def _headers(upstream: UpstreamConfig) -> dict[str, str]:
    headers = {
        "accept": "text/event-stream",
        "accept-encoding": "identity",
        "content-type": "application/json",
    }
    if upstream.api_key is not None:
        headers["authorization"] = f"Bearer {upstream.api_key}"
    return headers


def _connections(upstream: UpstreamConfig) -> int:
    return upstream.max_streams + 2  # and the health checks


# -- aiohttp ---------------------------------------------------------------------


@contextlib.contextmanager
def _aiohttp_errors(upstream: UpstreamConfig, what: str) -> Iterator[None]:
    try:
        yield
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
        raise HopConnectError(_message(upstream, what, exc)) from exc
    except (aiohttp.ClientError, ValueError) as exc:
        # ValueError: a request aiohttp will not send (userinfo in the URL and
        # an Authorization header, a URL it cannot read).
        raise HopError(_message(upstream, what, exc)) from exc


def _message(upstream: UpstreamConfig, what: str, exc: Exception) -> str:
    # The exception's class only: its text may quote a piece of a secret the
    # redactor cannot know as one (a client library may quote the part of a
    # Location's userinfo that it could not read as a port).
    return f"{what} {upstream.name}: {type(exc).__name__}"


class _AiohttpResponse:
    """``HopResponse`` over an aiohttp ``ClientResponse``."""

    __slots__ = ("_content", "_response", "_upstream", "status")

    def __init__(
        self, response: aiohttp.ClientResponse, upstream: UpstreamConfig
    ) -> None:
        self._response = response
        self._content = response.content
        self._upstream = upstream
        self.status = response.status

    def header(self, name: str) -> str | None:
        return self._response.headers.get(name)

    def __aiter__(self) -> _AiohttpResponse:
        return self

    async def __anext__(self) -> bytes:
        # Once per event of a stream: the error map is entered only on a failure.
        try:
            data = await self._content.readany()
        except (aiohttp.ClientError, ValueError):
            with _aiohttp_errors(self._upstream, "the body broke from"):
                raise
        if not data:
            raise StopAsyncIteration
        return data

    async def pour(self, feed: Callable[[bytes], bool]) -> bool:
        content = self._content
        try:
            while data := content.read_nowait():
                if not feed(data):
                    return False
        except (aiohttp.ClientError, ValueError):
            with _aiohttp_errors(self._upstream, "the body broke from"):
                raise
        if content.is_eof():
            return True
        pourer = _Pourer(content, feed)
        content._waiter = pourer  # type: ignore[assignment]  # see _Pourer
        try:
            ended = await pourer.future
        except (aiohttp.ClientError, ValueError):
            with _aiohttp_errors(self._upstream, "the body broke from"):
                raise
        finally:
            waiter: object = content._waiter
            if waiter is pourer:  # not another reader's, should one have come
                content._waiter = None
        if pourer.failed is not None:
            raise pourer.failed
        return ended

    async def aclose(self) -> None:
        if self._content.at_eof():
            self._response.release()
        else:
            self._response.close()


class _Pourer:
    """Stands in an aiohttp body reader's waiter for ``pour``.

    The reader keeps its next waiter in ``_waiter`` (a future the coroutine
    reading the body awaits) and, when bytes, a chunk's end or the body's end
    arrive, unsets it and calls ``set_result`` on it (``set_exception`` for a
    broken body), testing ``done()`` first. This object answers those calls
    at once: it takes what the reader holds (``read_nowait``), feeds it, and
    stands in again; ``future`` is set only when the pouring ends.
    """

    __slots__ = ("_content", "_feed", "failed", "future")

    def __init__(
        self, content: aiohttp.StreamReader, feed: Callable[[bytes], bool]
    ) -> None:
        self._content = content
        self._feed = feed
        self.failed: Exception | None = None  # what feed raised
        self.future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def done(self) -> bool:
        return self.future.done()

    def set_result(self, _: object) -> None:
        content, future = self._content, self.future
        if future.done():  # cancelled: the reading task is leaving
            return
        while True:
            # Nothing to read (the end of each HTTP chunk wakes this too, and
            # every read is followed by a look): the reader's own read would
            # make the same empty answer through four calls.
            if not content._buffer and content._exception is None:
                break
            try:
                data = content.read_nowait()
            except Exception as exc:  # the body's own error: pour maps it
                future.set_exception(exc)
                return
            if not data:  # a chunk's end, or all taken
                break
            try:
                go_on = self._feed(data)
            except Exception as exc:  # never into aiohttp's read callback
                self.failed = exc
                future.set_result(False)
                return
            if not go_on:
                future.set_result(False)
                return
        if content.is_eof():
            future.set_result(True)
            return
        content._waiter = self  # type: ignore[assignment]

    def set_exception(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class AiohttpHop:
    """``HopClient`` over one aiohttp ``ClientSession`` (made on first use: it
    needs the running event loop).

    Args:
        upstream: the upstream (its URL, key, stream cap and connect limit).
    """

    def __init__(self, upstream: UpstreamConfig) -> None:
        self._upstream = upstream
        self._base = upstream.url.rstrip("/") + "/"
        self._session: aiohttp.ClientSession | None = None

    def _url(self, path: str) -> str:
        return self._base + path.lstrip("/")

    def _client(self) -> aiohttp.ClientSession:
        session = self._session
        if session is None:
            connections = _connections(self._upstream)
            connector = aiohttp.TCPConnector(
                limit=connections, limit_per_host=0, keepalive_timeout=KEEPALIVE_S
            )
            connect_s = self._upstream.timeouts.connect_s
            session = self._session = aiohttp.ClientSession(
                connector=connector,
                headers=_headers(self._upstream),
                # Waiting for a free connection has no limit (the engine's pool
                # caps the streams); only the TCP connect has.
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_s),
                auto_decompress=False,
                trust_env=False,
            )
        return session

    async def post(self, path: str, body: bytes) -> HopResponse:
        with _aiohttp_errors(self._upstream, "no response from"):
            response = await self._client().post(
                self._url(path), data=body, allow_redirects=False
            )
        return _AiohttpResponse(response, self._upstream)

    async def get_status(self, path: str, timeout_s: float) -> int:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        try:
            with _aiohttp_errors(self._upstream, "no answer from"):
                async with self._client().get(
                    self._url(path), timeout=timeout, allow_redirects=False
                ) as response:
                    return response.status
        except TimeoutError as exc:  # the total limit
            raise HopError(f"no answer within {timeout_s} s") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
