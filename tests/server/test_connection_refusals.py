"""The answers ``LimitedH11Protocol`` gives itself, each reported to ``on_refuse``.

A connection past the cap gets a JSON 503 with ``Retry-After`` (uvicorn's own is
plain text without it); a head too late a 408; a head too large a 431. The
protocol is driven directly, on a fake transport, as uvicorn would drive it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.server import ServerState

from sluicegate.engines.clocks import ManualClock
from sluicegate.server.http.connections import (
    REFUSAL_CODES,
    ConnectionLimits,
    LimitedH11Protocol,
    protocol_class,
)

pytestmark = pytest.mark.anyio

GIVE_UP_S = 5.0


class FakeTransport(asyncio.Transport):
    """Records what the protocol writes, and whether it closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(scope: Scope, receive: Receive, send: Send) -> None:
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"2")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


class Server:
    """Connections of one uvicorn server whose protocol has ``limits``."""

    def __init__(
        self, limits: ConnectionLimits, timers: ManualClock | None = None
    ) -> None:
        self.reported: list[str] = []
        self.config = Config(
            app=_ok,
            http=protocol_class(limits, self.reported.append, timers),
            h11_max_incomplete_event_size=limits.max_header_bytes,
            log_level="warning",
        )
        self.config.load()
        self.state = ServerState()

    def connect(self) -> tuple[LimitedH11Protocol, FakeTransport]:
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.state, app_state={}
        )
        assert isinstance(protocol, LimitedH11Protocol)
        transport = FakeTransport()
        protocol.connection_made(transport)
        return protocol, transport


async def _until(condition: Callable[[], bool]) -> None:
    """Wait until ``condition()`` holds (polled every millisecond)."""
    with anyio.fail_after(GIVE_UP_S):
        while True:
            if condition():
                return
            await anyio.sleep(0.001)


async def _answered(transport: FakeTransport) -> bytes:
    """The response once its head, and the body it announces, were written."""

    def whole() -> bool:
        head, sep, body = bytes(transport.written).partition(b"\r\n\r\n")
        length = _head(head + sep)[1].get(b"content-length")
        return bool(sep) and length is not None and len(body) >= int(length)

    await _until(whole)
    return bytes(transport.written)


def _head(data: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


GET = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


async def test_a_request_past_the_cap_gets_a_json_503_with_retry_after() -> None:
    server = Server(ConnectionLimits(max_connections=2, retry_after_s=3))
    (first, served), (second, waiting) = server.connect(), server.connect()
    first.data_received(GET)
    assert _head(await _answered(served))[0].startswith(b"HTTP/1.1 200 ")
    third, refused = server.connect()
    third.data_received(GET)
    status, headers, body = _head(await _answered(refused))
    assert status.startswith(b"HTTP/1.1 503 "), status
    assert headers[b"retry-after"] == b"3"
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("server_error", "too_many_connections")
    assert "at most 2 connections" in error["message"]
    await _until(lambda: refused.closed)
    assert server.reported == ["too_many_connections"]
    # Two open again once the refused one is gone: a request is served.
    third.connection_lost(None)
    second.data_received(GET)
    assert _head(await _answered(waiting))[0].startswith(b"HTTP/1.1 200 ")
    assert server.reported == ["too_many_connections"]
    for protocol in (first, second):
        protocol.connection_lost(None)


async def test_without_a_cap_every_connection_is_served() -> None:
    server = Server(ConnectionLimits())
    opened = [server.connect() for _ in range(5)]
    for protocol, _ in opened:
        protocol.data_received(GET)
    for protocol, transport in opened:
        assert _head(await _answered(transport))[0].startswith(b"HTTP/1.1 200 ")
        protocol.connection_lost(None)
    assert server.reported == []


async def test_a_late_head_is_a_408_and_reported() -> None:
    clock = ManualClock()
    server = Server(ConnectionLimits(header_timeout_s=5), clock)
    protocol, transport = server.connect()
    protocol.data_received(b"GET /health HTTP/1.1\r\n")
    clock.advance(4.5)
    assert transport.written == b""  # not late yet
    clock.advance(0.5)
    status, _, body = _head(bytes(transport.written))
    assert status.startswith(b"HTTP/1.1 408 "), status
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert transport.closed
    assert server.reported == ["request_timeout"]
    protocol.connection_lost(None)


async def test_a_head_over_the_limit_is_a_431_and_reported() -> None:
    server = Server(ConnectionLimits(max_header_bytes=1024))
    protocol, transport = server.connect()
    protocol.data_received(b"GET /health HTTP/1.1\r\nX-Big: " + b"a" * 4096)
    status, _, body = _head(await _answered(transport))
    assert status.startswith(b"HTTP/1.1 431 "), status
    assert json.loads(body)["error"]["code"] == "request_header_too_large"
    assert server.reported == ["request_header_too_large"]
    protocol.connection_lost(None)


async def test_a_whole_head_over_the_limit_in_one_read_is_a_431() -> None:
    server = Server(ConnectionLimits(max_header_bytes=1024))
    protocol, transport = server.connect()
    head = b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n"
    protocol.data_received(head)  # h11 would parse it whole: no limit of its own
    status, _, body = _head(await _answered(transport))
    assert status.startswith(b"HTTP/1.1 431 "), status
    assert json.loads(body)["error"]["code"] == "request_header_too_large"
    assert transport.closed
    assert server.reported == ["request_header_too_large"]
    protocol.connection_lost(None)


async def test_a_small_head_with_a_large_body_in_one_read_is_served() -> None:
    server = Server(ConnectionLimits(max_header_bytes=1024))
    protocol, transport = server.connect()
    body = b"x" * 8192
    protocol.data_received(
        b"POST /health HTTP/1.1\r\nHost: t\r\ncontent-length: %d\r\n\r\n%s"
        % (len(body), body)
    )
    status, _, _ = _head(await _answered(transport))
    assert not status.startswith(b"HTTP/1.1 431 "), status
    assert server.reported == []
    protocol.connection_lost(None)


def test_every_reported_code_is_listed() -> None:
    assert set(REFUSAL_CODES) == {
        "request_timeout",
        "request_header_too_large",
        "too_many_connections",
    }


@pytest.mark.parametrize(
    "fields", [{"max_connections": 0}, {"retry_after_s": -1}], ids=str
)
def test_the_cap_and_its_retry_after_must_be_in_range(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(fields))):
        ConnectionLimits(**fields)


async def test_a_lost_connection_lets_go_of_its_app() -> None:
    # While served, the protocol's app is its own method (the cap's check): a
    # reference cycle that must not outlive the connection.
    server = Server(ConnectionLimits())
    protocol, transport = server.connect()
    assert getattr(protocol.app, "__self__", None) is protocol
    protocol.data_received(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    assert (await _answered(transport)).startswith(b"HTTP/1.1 200 ")
    protocol.connection_lost(None)
    assert getattr(protocol.app, "__self__", None) is not protocol
