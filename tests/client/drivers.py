"""One awaitable face for both clients, so that every client test runs on each.

``Driver`` wraps a ``Client`` or an ``AsyncClient`` and ``StreamDriver`` one of
their streams; the sync side simply calls the blocking method inside the async
test (a mock transport never blocks). The ``client_kind`` fixture of
``conftest.py`` picks the side.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx

from sluicegate.client import (
    AsyncClient,
    AsyncStream,
    Client,
    Stream,
    StreamResult,
    Timeouts,
)

from .wire import Part, transport

KINDS = ("sync", "async")


class StreamDriver:
    """A ``Stream`` or an ``AsyncStream``, driven the same way."""

    def __init__(self, stream: Stream | AsyncStream) -> None:
        self.stream = stream
        self._deltas: Any = None

    def start(self) -> None:
        """Ask for the iterator (``iter()`` or ``__aiter__()``); may raise misuse."""
        if isinstance(self.stream, Stream):
            self._deltas = iter(self.stream)
        else:
            self._deltas = self.stream.__aiter__()

    def interrupt(self) -> None:
        """``interrupt()``: the same plain method on both sides."""
        self.stream.interrupt()

    async def texts(self, limit: int | None = None) -> list[str]:
        """The delta texts, up to ``limit`` of them (then stop reading, open)."""
        self.start()
        texts: list[str] = []
        if limit == 0:
            return texts
        if isinstance(self.stream, Stream):
            for delta in self._deltas:
                texts.append(delta.text)
                if len(texts) == limit:
                    break
        else:
            async for delta in self._deltas:
                texts.append(delta.text)
                if len(texts) == limit:
                    break
        return texts

    async def result(self) -> StreamResult:
        if isinstance(self.stream, Stream):
            return self.stream.result()
        return await self.stream.aresult()

    async def close(self) -> None:
        if isinstance(self.stream, Stream):
            self.stream.close()
        else:
            await self.stream.aclose()

    async def __aenter__(self) -> StreamDriver:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class Driver:
    """A ``Client`` or an ``AsyncClient`` behind one set of awaitable methods."""

    def __init__(self, client: Client | AsyncClient) -> None:
        self.client = client

    def stream_chat(self, messages: Any, **kwargs: Any) -> StreamDriver:
        if isinstance(self.client, Client):
            return StreamDriver(self.client.stream_chat(messages, **kwargs))
        return StreamDriver(self.client.astream_chat(messages, **kwargs))

    async def chat(self, messages: Any, **kwargs: Any) -> StreamResult:
        if isinstance(self.client, Client):
            return self.client.chat(messages, **kwargs)
        return await self.client.achat(messages, **kwargs)

    async def complete(self, prompt: str, **kwargs: Any) -> StreamResult:
        if isinstance(self.client, Client):
            return self.client.complete(prompt, **kwargs)
        return await self.client.acomplete(prompt, **kwargs)

    async def close(self) -> None:
        if isinstance(self.client, Client):
            self.client.close()
        else:
            await self.client.aclose()

    async def __aenter__(self) -> Driver:
        if isinstance(self.client, Client):
            assert self.client.__enter__() is self.client
        else:
            assert await self.client.__aenter__() is self.client
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        if isinstance(self.client, Client):
            self.client.__exit__(*exc_info)
        else:
            await self.client.__aexit__(*exc_info)


def driver(kind: str, *args: Any, **kwargs: Any) -> Driver:
    """A client of ``kind`` (``"sync"`` or ``"async"``) made with these arguments."""
    made = Client if kind == "sync" else AsyncClient
    return Driver(made(*args, **kwargs))


def replaying(
    kind: str,
    parts: Iterable[Part],
    status: int = 200,
    timeouts: Timeouts | None = None,
    headers: dict[str, str] | None = None,
) -> Driver:
    """A client of ``kind`` whose every request is answered with ``parts``."""
    mock = transport(parts, status, headers, asynchronous=kind == "async")
    return driver(kind, transport=mock, timeouts=timeouts)


def handled(kind: str, handler: Any, **kwargs: Any) -> Driver:
    """A client of ``kind`` whose requests go to ``handler`` (``MockTransport``)."""
    return driver(kind, transport=httpx.MockTransport(handler), **kwargs)
