"""``ChunkedBodySend``: the bytes on the wire equal uvicorn's own h11 protocol's.

The same streaming apps run behind ``LimitedH11Protocol`` (body parts framed
by ``ChunkedBodySend``) and behind uvicorn's plain ``H11Protocol`` (h11 frames
them), each on a fake transport; what each wrote must be byte for byte the same
(the ``date`` header aside), for HTTP/1.1 and HTTP/1.0 peers, ``HEAD``, a
``Content-Length`` response, empty parts, and a response cut short.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.chunked_body import ChunkedBodySend
from sluicegate.server.http.connections import ConnectionLimits, protocol_class
from sluicegate.server.streaming.sse_response import EventStreamResponse
from tests.polling import wait_until
from tests.server.asgi import HELLO
from tests.server.test_connection_refusals import FakeTransport

GIVE_UP_S = 10.0

pytestmark = pytest.mark.anyio

PARTS = [b"data: 1\n\n", b"", "data: \u00e9\u4e16\n\n".encode(), b"x" * 300]


def streaming_app(
    parts: list[bytes],
    *,
    length: int | None = None,
    end: bool = True,
    status: int = 200,
) -> Any:
    seen: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(send)
        headers = [(b"content-type", b"text/event-stream")]
        if length is not None:
            headers.append((b"content-length", str(length).encode()))
        await send(
            {"type": "http.response.start", "status": status, "headers": headers}
        )
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        if end:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    app.seen = seen  # type: ignore[attr-defined]
    return app


async def written(protocol_class_: type, app: Any, request: bytes) -> bytes:
    config = Config(app=app, http=protocol_class_, log_level="warning")
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}
    )
    transport = FakeTransport()
    protocol.connection_made(transport)
    protocol.data_received(request)
    cycle = protocol.cycle  # type: ignore[attr-defined]
    for _ in range(200):  # the app's task runs on this loop
        if cycle.response_complete or transport.closed or cycle.disconnected:
            break
        await asyncio.sleep(0.001)
    return re.sub(rb"date: [^\r]*\r\n", b"", bytes(transport.written))


def requests() -> list[tuple[str, bytes]]:
    return [
        ("http/1.1", b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
        ("http/1.0", b"POST /v1/x HTTP/1.0\r\nHost: a\r\nContent-Length: 0\r\n\r\n"),
        ("head", b"HEAD /v1/x HTTP/1.1\r\nHost: a\r\n\r\n"),
        ("close", b"GET /v1/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
    ]


LIMITED = protocol_class(ConnectionLimits())


@pytest.mark.parametrize(
    ("name", "request_"), requests(), ids=[n for n, _ in requests()]
)
@pytest.mark.parametrize("end", [True, False], ids=["ended", "cut"])
async def test_the_wire_is_h11s_for_every_peer(
    name: str, request_: bytes, end: bool
) -> None:
    app = streaming_app(PARTS, end=end)
    ours = await written(LIMITED, app, request_)
    theirs = await written(H11Protocol, streaming_app(PARTS, end=end), request_)
    assert ours == theirs
    (send,) = app.seen
    assert send._chunked == (name in ("http/1.1", "close"))  # framed here
    if send._chunked:
        assert b"transfer-encoding: chunked" in ours.lower()
        assert b"\r\n9\r\ndata: 1\n\n\r\n" in ours


async def test_a_response_with_a_length_is_h11s() -> None:
    app = streaming_app([b"ab", b"cd"], length=4)
    ours = await written(LIMITED, app, requests()[0][1])
    theirs = await written(
        H11Protocol, streaming_app([b"ab", b"cd"], length=4), requests()[0][1]
    )
    assert ours == theirs
    assert ours.endswith(b"\r\n\r\nabcd")
    (send,) = app.seen
    assert isinstance(send, ChunkedBodySend)
    assert not send._chunked  # framed by h11: it counts the length


@given(st.lists(st.binary(max_size=40), max_size=8))
async def test_any_parts_are_framed_as_h11_frames_them(parts: list[bytes]) -> None:
    request_ = requests()[0][1]
    app = streaming_app(parts)
    ours = await written(LIMITED, app, request_)
    assert ours == await written(H11Protocol, streaming_app(parts), request_)
    (send,) = app.seen
    assert send._chunked


def parts_now_app(parts: list[bytes], *, pause_at: int | None = None) -> Any:
    """Like ``streaming_app``, each part written by ``write_now`` in two pieces
    when it can (the frame sink's way), else by ``send``; with ``pause_at``,
    the transport is paused before that part and resumed after it."""
    seen: list[tuple[Any, bool]] = []  # (send, whether write_now wrote)

    async def app(scope: Scope, receive: Receive, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        flow = send._cycle.flow
        for at, part in enumerate(parts):
            if at == pause_at:
                flow.pause_writing()
            wrote = send.write_now([part[:1], part[1:]])
            seen.append((send, wrote))
            if at == pause_at:
                flow.resume_writing()
            if not wrote:
                await send(
                    {"type": "http.response.body", "body": part, "more_body": True}
                )
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app.seen = seen  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize(
    ("name", "request_"), requests(), ids=[n for n, _ in requests()]
)
async def test_write_now_writes_h11s_bytes_or_declines(
    name: str, request_: bytes
) -> None:
    app = parts_now_app(PARTS)
    ours = await written(LIMITED, app, request_)
    assert ours == await written(H11Protocol, streaming_app(PARTS), request_)
    chunked = name in ("http/1.1", "close")
    assert [wrote for _, wrote in app.seen] == [chunked] * len(PARTS)


async def test_write_now_declines_while_the_transport_is_paused() -> None:
    app = parts_now_app(PARTS, pause_at=2)
    ours = await written(LIMITED, app, requests()[0][1])
    assert ours == await written(H11Protocol, streaming_app(PARTS), requests()[0][1])
    assert [wrote for _, wrote in app.seen] == [True, True, False, True]


def start_with_app(parts: list[bytes], *, paused: bool = False) -> Any:
    """Like ``streaming_app``, the head and the first part sent by
    ``start_with``; with ``paused``, while the transport is paused (two sends:
    it then waits for the transport like any send)."""
    writes: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        start = {"type": "http.response.start", "status": 200, "headers": headers}
        transport = send._cycle.transport
        write = transport.write

        def recorded(data: bytes) -> None:
            writes.append(bytes(data))
            write(data)

        transport.write = recorded
        flow = send._cycle.flow
        if paused:
            flow.pause_writing()
            asyncio.get_running_loop().call_soon(flow.resume_writing)
        await send.start_with(send, start, parts[0])
        for part in parts[1:]:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    app.writes = writes  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize(
    ("name", "request_"), requests(), ids=[n for n, _ in requests()]
)
@pytest.mark.parametrize("paused", [False, True], ids=["writable", "paused"])
async def test_start_with_writes_h11s_bytes_in_one_write_when_chunked(
    name: str, request_: bytes, paused: bool
) -> None:
    app = start_with_app(PARTS, paused=paused)
    ours = await written(LIMITED, app, request_)
    assert ours == await written(H11Protocol, streaming_app(PARTS), request_)
    first = re.sub(rb"date: [^\r]*\r\n", b"", app.writes[0])
    head = ours[: ours.index(b"\r\n\r\n") + 4]
    if name in ("http/1.1", "close") and not paused:
        assert first == head + b"9\r\ndata: 1\n\n\r\n"  # the head and the part
    else:
        assert first == head  # the head alone, as h11 writes it


def end_with_app(parts: list[bytes], *, paused: str = "") -> Any:
    """Like ``streaming_app``, the last part and the body's end sent by
    ``end_with``; with ``paused="before"``, while the transport is paused (two
    sends: they then wait for the transport like any send); with
    ``paused="by_write"``, the transport pauses on the write of ``end_with``
    (uvicorn's send of the end then waits for it)."""
    writes: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Any) -> None:
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in parts[:-1]:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        transport = send._cycle.transport
        write = transport.write
        flow = send._cycle.flow
        loop = asyncio.get_running_loop()

        def recorded(data: bytes) -> None:
            writes.append(bytes(data))
            write(data)
            if paused == "by_write" and not flow.write_paused:
                flow.pause_writing()
                loop.call_soon(flow.resume_writing)

        transport.write = recorded
        if paused == "before":
            flow.pause_writing()
            loop.call_soon(flow.resume_writing)
        await send.end_with(parts[-1])
        assert send._cycle.response_complete

    app.writes = writes  # type: ignore[attr-defined]
    return app


@pytest.mark.parametrize(
    ("name", "request_"), requests(), ids=[n for n, _ in requests()]
)
@pytest.mark.parametrize("paused", ["", "before", "by_write"])
async def test_end_with_writes_h11s_bytes_in_one_write_when_chunked(
    name: str, request_: bytes, paused: str
) -> None:
    parts = [*PARTS, b"data: [DONE]\n\n"]
    app = end_with_app(parts, paused=paused)
    ours = await written(LIMITED, app, request_)
    assert ours == await written(H11Protocol, streaming_app(parts), request_)
    if name in ("http/1.1", "close") and paused != "before":
        assert app.writes[0] == b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
        assert b"".join(app.writes) == app.writes[0]  # the rest dropped
    elif name == "head":
        assert b"".join(app.writes) == b""
    else:
        assert app.writes[-1] == (b"0\r\n\r\n" if name != "http/1.0" else b"")


@pytest.mark.parametrize("body", [b"", b"data: [DONE]\n\n"], ids=["empty", "part"])
async def test_after_end_with_the_connection_is_closed_or_answers_the_next(
    body: bytes,
) -> None:
    """The state after ``end_with`` is uvicorn's after its own end: a close
    asked for closes, a pipelined request is answered after the body's end."""
    for request_, closed in [
        (requests()[3][1], True),
        (requests()[0][1] * 2, False),
    ]:
        app = end_with_app([b"data: 1\n\n", body])
        config = Config(app=app, http=LIMITED, log_level="warning")
        config.load()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}
        )
        transport = FakeTransport()
        protocol.connection_made(transport)
        protocol.data_received(request_)
        for _ in range(200):
            if transport.written.count(b"0\r\n\r\n") == (1 if closed else 2):
                break
            await asyncio.sleep(0.001)
        assert transport.closed is closed
        wire = bytes(transport.written)
        assert wire.count(b"HTTP/1.1 200 OK") == (1 if closed else 2)
        first_end = wire.index(b"0\r\n\r\n") + 5
        assert wire[first_end:].startswith(b"" if closed else b"HTTP/1.1 200 OK")


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "task"])
async def test_a_streams_last_frames_and_its_end_go_out_in_one_write(
    eager: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind the server's own protocol, a finished stream's last write is its
    last frames and the body's end, whichever writer took them; the wire is
    the whole stream."""
    monkeypatch.setattr(EventStreamResponse, "eager", eager)
    app = create_app(ScriptedEngine(tokens_per_s=2000), ServerConfig())
    config = Config(app=app, http=LIMITED, log_level="warning")
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}
    )
    transport = FakeTransport()
    writes: list[bytes] = []
    write = transport.write

    def recorded(data: Any) -> None:
        writes.append(bytes(data))
        write(data)

    transport.write = recorded  # type: ignore[method-assign]
    body = orjson.dumps({"messages": HELLO, "stream": True})
    protocol.connection_made(transport)
    protocol.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
        b"Content-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n%b"
        % (len(body), body)
    )
    await wait_until(lambda: protocol.cycle.response_complete, GIVE_UP_S)  # type: ignore[attr-defined]
    assert writes[-1].endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert writes[-1].count(b"\r\n0\r\n\r\n") == 1
    assert bytes(transport.written).count(b"data: [DONE]") == 1
