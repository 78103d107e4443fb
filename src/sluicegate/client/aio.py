"""The async client: ``AsyncClient`` and ``AsyncStream``, twins of ``client.sync``.

Same behaviour, same results; async names carry an ``a`` (``achat``,
``astream_chat``, ``aresult``, ``aclose``). Runs on any anyio backend that httpx
supports.

Usage::

    async with AsyncClient("http://127.0.0.1:8000") as client:
        async with client.astream_chat(messages, model="m") as stream:
            async for delta in stream:
                print(delta.text, end="")
        print((await stream.aresult()).end_state)
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any, Self

import httpx

from sluicegate.client.assemble import StreamAssembler
from sluicegate.client.results import StreamResult, TextDelta, TimeoutKind
from sluicegate.client.shell import (
    Ending,
    Timeouts,
    api_url,
    capture,
    chat_body,
    completion_body,
)
from sluicegate.core.errors import StreamClosed, StreamConsumed

__all__ = ["AsyncClient", "AsyncStream"]


class AsyncStream:
    """One streaming response, read asynchronously; see ``client.sync.Stream``.

    Nothing is sent until the stream is first iterated or ``aresult()`` is awaited.
    Iterate it at most once (``StreamConsumed`` otherwise); ``aclose()`` stops
    reading and closes the connection, so that the server aborts the request.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        request: httpx.Request,
        n: int,
        timeouts: Timeouts,
        record: bool,
    ) -> None:
        self._http = http
        self._request = request
        self._timeouts = timeouts
        self._assembler = StreamAssembler(n, record=record)
        self._gen: AsyncGenerator[TextDelta, None] = self._run()
        self._iterated = False
        self._result: StreamResult | None = None

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
        """Read whatever is left (sending the request if need be); the outcome."""
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

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(self) -> AsyncGenerator[TextDelta, None]:
        start = time.monotonic()
        ending = Ending()
        response: httpx.Response | None = None
        try:
            with capture(ending):
                response = await self._http.send(self._request, stream=True)
                ending.headed = True
                elapsed = time.monotonic() - start
                self._assembler.head(response.status_code, response.headers, elapsed)
                timeouts = response.request.extensions["timeout"]  # read per body
                timeouts["read"] = self._timeouts.body_read_s(elapsed)
                async for data in response.aiter_bytes():
                    elapsed = time.monotonic() - start
                    for delta in self._assembler.feed(data, elapsed):
                        yield delta
                    if self._assembler.stopped:
                        break
                    if self._timeouts.over_total(elapsed):
                        ending.timeout = TimeoutKind.TOTAL
                        break
        except BaseException:  # closed, Ctrl-C, cancelled: the client gave up
            ending.client_gone = True
            raise
        finally:
            if response is not None:
                await response.aclose()
            self._result = self._assembler.flush(
                time.monotonic() - start,
                client_gone=ending.client_gone,
                timeout=ending.timeout,
                transport_error=ending.transport_error,
            )


class AsyncClient:
    """The async twin of ``client.sync.Client``; same arguments.

    ``transport`` is an ``httpx.AsyncBaseTransport``.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.timeouts = timeouts or Timeouts()
        sent = dict(headers or {})
        if api_key:
            sent["Authorization"] = f"Bearer {api_key}"
        self.http = httpx.AsyncClient(
            base_url=api_url(base_url),
            headers=sent,
            transport=transport,
            timeout=self.timeouts.head(),
        )

    def astream_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str,
        include_usage: bool = True,
        record: bool = False,
        **params: Any,
    ) -> AsyncStream:
        """An ``AsyncStream`` of a chat completion; see ``Client.stream_chat``.

        Spec: OpenAI API reference, "Create chat completion".
        """
        body = chat_body(messages, model, include_usage, params)
        return self._stream("chat/completions", body, record)

    def astream_completion(
        self,
        prompt: str,
        *,
        model: str,
        include_usage: bool = True,
        record: bool = False,
        **params: Any,
    ) -> AsyncStream:
        """An ``AsyncStream`` of a text completion; see ``Client.stream_completion``.

        Spec: OpenAI API reference, "Create completion" (legacy).
        """
        body = completion_body(prompt, model, include_usage, params)
        return self._stream("completions", body, record)

    async def achat(
        self, messages: Sequence[Mapping[str, Any]], *, model: str, **params: Any
    ) -> StreamResult:
        """Stream a chat completion to its end; its ``StreamResult``."""
        async with self.astream_chat(messages, model=model, **params) as stream:
            return await stream.aresult()

    async def acomplete(
        self, prompt: str, *, model: str, **params: Any
    ) -> StreamResult:
        """Stream a text completion to its end; its ``StreamResult``."""
        async with self.astream_completion(prompt, model=model, **params) as stream:
            return await stream.aresult()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def _stream(self, path: str, body: dict[str, Any], record: bool) -> AsyncStream:
        request = self.http.build_request("POST", path, json=body)
        n = int(body.get("n") or 1)
        return AsyncStream(self.http, request, n, self.timeouts, record)
