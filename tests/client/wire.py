"""Recorded-style response bodies and mock transports for the client tests.

Bodies are built with the core's own encoder and chunk builders, so they are the
wire format the server sends; ``Gap`` items in a body stand for silences that a
mock transport turns into ``httpx.ReadTimeout`` when the request's read timeout
is shorter (no test sleeps), and a ``Cut`` for the connection breaking.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from sluicegate.core.events import FinishReason, Usage
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    dumps,
    error_payload,
    usage_chunk,
)
from sluicegate.core.wire.sse import DONE, encode_comment, encode_event

HEADER = ResponseHeader(
    id="chatcmpl-1", created=1, model="m", endpoint=Endpoint.CHAT, include_usage=True
)
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}


@dataclass(frozen=True)
class Gap:
    """A silence of ``seconds`` in a streamed body."""

    seconds: float


def frame(obj: dict[str, Any]) -> bytes:
    """One SSE event carrying ``obj`` as compact JSON."""
    return encode_event(dumps(obj))


def chat_frames(
    pieces: Sequence[str], *, index: int = 0, header: ResponseHeader = HEADER
) -> list[bytes]:
    """Role chunk, one content chunk per piece, the finish chunk (no usage/DONE)."""
    frames = [frame(chat_chunk(header, index, {"role": "assistant"}))]
    frames += [frame(chat_chunk(header, index, {"content": p})) for p in pieces]
    frames.append(frame(chat_chunk(header, index, {}, FinishReason.STOP)))
    return frames


def good_body(pieces: Sequence[str] = ("Hel", "lo", " wörld 🤖")) -> bytes:
    """A complete chat stream: role, content, finish, usage chunk, ``[DONE]``."""
    usage = frame(usage_chunk(HEADER, Usage(5, len(pieces))))
    return b"".join([*chat_frames(pieces), usage, DONE])


def error_body() -> bytes:
    """Two content chunks, then an in-band error event and no ``[DONE]``."""
    frames = chat_frames(["a", "b"])[:3]
    error = frame(error_payload("engine fell over", "server_error", code="engine"))
    return b"".join([*frames, encode_comment(), error])


@dataclass(frozen=True)
class Cut:
    """The connection breaking at this point of a streamed body."""

    message: str = "peer closed connection"


Part = bytes | Gap | Cut


def transport(
    parts: Iterable[Part],
    status: int = 200,
    headers: dict[str, str] | None = None,
    *,
    asynchronous: bool = False,
) -> httpx.MockTransport:
    """A transport answering every request with ``parts`` as the body.

    ``asynchronous`` gives the body as an async iterator, which ``AsyncClient``
    needs (and ``Client`` refuses).
    """
    items = list(parts)

    def handler(request: httpx.Request) -> httpx.Response:
        body = _async_body if asynchronous else _sync_body
        return httpx.Response(
            status,
            headers=SSE_HEADERS if headers is None else headers,
            content=body(items, request),
        )

    return httpx.MockTransport(handler)


def _check(item: Gap | Cut, request: httpx.Request) -> None:
    if isinstance(item, Cut):
        raise httpx.RemoteProtocolError(item.message, request=request)
    limit = request.extensions["timeout"]["read"]
    if limit is not None and item.seconds > limit:
        raise httpx.ReadTimeout("simulated silence", request=request)


def _sync_body(items: list[Part], request: httpx.Request) -> Iterator[bytes]:
    for item in items:
        if isinstance(item, bytes):
            yield item
        else:
            _check(item, request)


async def _async_body(
    items: list[Part], request: httpx.Request
) -> AsyncIterator[bytes]:
    for item in items:
        if isinstance(item, bytes):
            yield item
        else:
            _check(item, request)


def bytewise(body: bytes) -> list[bytes]:
    """``body`` one byte at a time."""
    return [body[i : i + 1] for i in range(len(body))]
