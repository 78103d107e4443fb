"""The HTTP hop's client (engines/upstream/http.py) against real servers.

The raw upstream is an asyncio HTTP/1.1 server in the test's own loop that
answers with the exact bytes each test gives it and records what it was sent,
so status, headers, body bytes, resets and closes are checked on the wire. The
last tests run ``UpstreamEngine`` against a real scripted sluicegate: its
outputs, an abort that reaches the upstream, and a gateway's per-upstream
metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import orjson
import pytest
from tests.polling import wait_until

from sluicegate.core.events import FinishReason, TextOutput
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import (
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    TextPrompt,
)
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.upstream.config import UpstreamConfig, UpstreamTimeouts
from sluicegate.engines.upstream.engine import UpstreamEngine
from sluicegate.engines.upstream.http import (
    AiohttpHop,
    HopClient,
    HopError,
    HopResponse,
)
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.testing import ServerProcess, free_port, serve_command

pytestmark = pytest.mark.anyio

ReadBody = Callable[[HopResponse], Awaitable[bytes]]

GIVE_UP_S = 10.0
ABORT_WITHIN_S = 1.0
"""How soon the upstream must list an aborted request (docs/DESIGN.md, "Engine
protocol"), measured from ``close()``."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RawUpstream:
    """Answers each request with the next answer's bytes; records what came.

    An answer's piece is bytes to send, ``None`` to reset the connection there,
    or an ``asyncio.Event`` to wait for before the next piece."""

    def __init__(self) -> None:
        self.answers: list[list[bytes | asyncio.Event | None]] = []
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.connections = 0
        self.eof = asyncio.Event()  # a client closed a connection

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.requests.append((head, await reader.readexactly(length)))
                for piece in self.answers.pop(0):
                    if piece is None:  # reset the connection here
                        writer.transport.abort()
                        return
                    if isinstance(piece, asyncio.Event):
                        await piece.wait()
                        continue
                    writer.write(piece)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()
        finally:
            writer.close()


@pytest.fixture
async def raw() -> AsyncIterator[tuple[RawUpstream, str]]:
    upstream = RawUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream, f"http://127.0.0.1:{port}/v1"
        server.close()


def chunked(
    *pieces: bytes | asyncio.Event, end: bool = True
) -> list[bytes | asyncio.Event | None]:
    """A 200 event stream, one HTTP chunk per piece (an event: a wait)."""
    out: list[bytes | asyncio.Event | None] = [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    ]
    out += [
        p if isinstance(p, asyncio.Event) else f"{len(p):x}\r\n".encode() + p + b"\r\n"
        for p in pieces
    ]
    if end:
        out.append(b"0\r\n\r\n")
    return out


def client_for(url: str, api_key: str | None = None) -> HopClient:
    return AiohttpHop(UpstreamConfig(url, api_key=api_key))


async def iterate_body(response: HopResponse) -> bytes:
    return b"".join([data async for data in response])


async def pour_body(response: HopResponse) -> bytes:
    pieces: list[bytes] = []

    def feed(data: bytes) -> bool:
        assert data
        pieces.append(data)
        return True

    assert await response.pour(feed) is True
    assert await response.pour(feed) is True  # and again: the end stays
    return b"".join(pieces)


@pytest.fixture(params=["iterate", "pour"])
def read_body(request: pytest.FixtureRequest) -> ReadBody:
    """The body read by iterating it, and by its fast twin ``pour``."""
    return iterate_body if request.param == "iterate" else pour_body


async def test_a_stream_comes_back_byte_for_byte(
    raw: tuple[RawUpstream, str], read_body: ReadBody
) -> None:
    upstream, url = raw
    pieces = [b"data: 1\n\n", b"data: \xc3", b"\xa9\n\n", b"data: [DONE]\n\n"]
    upstream.answers.append(chunked(*pieces))
    client = client_for(url, api_key="k3y")
    try:
        response = await client.post("chat/completions", b'{"stream":true}')
        assert response.status == 200
        assert response.header("content-type") == "text/event-stream"
        assert response.header("retry-after") is None
        assert await read_body(response) == b"".join(pieces)
        await response.aclose()
        await response.aclose()  # idempotent
    finally:
        await client.aclose()
    head, body = upstream.requests[0]
    assert body == b'{"stream":true}'
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    fields = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
    assert fields["authorization"] == "Bearer k3y"
    assert fields["accept-encoding"] == "identity"
    assert fields["accept"] == "text/event-stream"
    assert fields["content-type"] == "application/json"


async def test_a_refusal_has_its_status_headers_and_body(
    raw: tuple[RawUpstream, str],
    read_body: ReadBody,
) -> None:
    upstream, url = raw
    error = orjson.dumps({"error": {"message": "slow down"}})
    upstream.answers.append(
        [
            b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\n"
            + f"content-length: {len(error)}\r\n\r\n".encode()
            + error
        ]
    )
    client = client_for(url)
    try:
        response = await client.post("completions", b"{}")
        assert (response.status, response.header("Retry-After")) == (429, "7")
        assert await read_body(response) == error
        await response.aclose()
    finally:
        await client.aclose()
    assert upstream.requests[0][0].startswith(b"POST /v1/completions ")


async def test_a_finished_body_keeps_its_connection(
    raw: tuple[RawUpstream, str],
    read_body: ReadBody,
) -> None:
    upstream, url = raw
    client = client_for(url)
    try:
        for i in range(3):
            upstream.answers.append(chunked(b"data: %d\n\n" % i))
            response = await client.post("chat/completions", b"{}")
            assert await read_body(response) == b"data: %d\n\n" % i
            await response.aclose()
    finally:
        await client.aclose()
    assert (len(upstream.requests), upstream.connections) == (3, 1)


async def test_closing_an_unfinished_body_closes_its_connection(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    upstream.answers.append(chunked(b"data: 1\n\n", end=False))
    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        assert await anext(aiter(response)) == b"data: 1\n\n"
        await response.aclose()
        await asyncio.wait_for(upstream.eof.wait(), GIVE_UP_S)
    finally:
        await client.aclose()


async def test_a_reset_mid_body_is_a_hop_error(
    raw: tuple[RawUpstream, str], read_body: ReadBody
) -> None:
    upstream, url = raw
    upstream.answers.append([*chunked(b"data: 1\n\n", end=False), None])
    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        with pytest.raises(HopError, match="the body broke"):
            await read_body(response)
        await response.aclose()
    finally:
        await client.aclose()


async def test_a_body_cut_short_is_a_hop_error(
    raw: tuple[RawUpstream, str], read_body: ReadBody
) -> None:
    upstream, url = raw
    upstream.answers.append(
        [b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\ndata: 1\n\n", None]
    )
    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        with pytest.raises(HopError):
            await read_body(response)
        await response.aclose()
    finally:
        await client.aclose()


async def test_pour_feeds_each_piece_as_it_arrives_and_iteration_goes_on(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    second, third = asyncio.Event(), asyncio.Event()
    upstream.answers.append(
        chunked(b"data: 1\n\n", second, b"data: 2\n\n", third, b"data: 3\n\n")
    )
    fed: list[bytes] = []

    def feed(data: bytes) -> bool:
        fed.append(data)
        second.set()  # the next piece comes while the pouring waits
        return data != b"data: 2\n\n"

    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        assert await response.pour(feed) is False
        assert fed == [b"data: 1\n\n", b"data: 2\n\n"]
        third.set()
        assert await iterate_body(response) == b"data: 3\n\n"
        await response.aclose()
    finally:
        await client.aclose()
    assert (len(upstream.requests), upstream.connections) == (1, 1)


async def test_what_feed_raises_comes_out_of_pour(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    second = asyncio.Event()
    upstream.answers.append(chunked(b"data: 1\n\n", second, b"data: 2\n\n", end=False))

    def feed(data: bytes) -> bool:
        second.set()
        if data == b"data: 2\n\n":
            raise ValueError("fed up")
        return True

    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        with pytest.raises(ValueError, match="fed up"):
            await response.pour(feed)
        await response.aclose()
        await asyncio.wait_for(upstream.eof.wait(), GIVE_UP_S)
    finally:
        await client.aclose()


async def test_a_reset_while_pouring_is_a_hop_error(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    reset = asyncio.Event()
    upstream.answers.append([*chunked(b"data: 1\n\n", end=False), reset, None])

    def feed(data: bytes) -> bool:
        reset.set()
        return True

    client = client_for(url)
    try:
        response = await client.post("chat/completions", b"{}")
        with pytest.raises(HopError, match="the body broke"):
            await response.pour(feed)
        await response.aclose()
    finally:
        await client.aclose()


async def test_no_listener_is_a_hop_error() -> None:
    client = client_for(f"http://127.0.0.1:{free_port()}/v1")
    try:
        with pytest.raises(HopError, match="no response from"):
            await client.post("chat/completions", b"{}")
        with pytest.raises(HopError, match="no answer from"):
            await client.get_status("/models", 5.0)
    finally:
        await client.aclose()


async def test_a_malformed_head_is_a_hop_error(raw: tuple[RawUpstream, str]) -> None:
    upstream, url = raw
    upstream.answers.append([b"NOT HTTP AT ALL\r\n\r\n"])
    client = client_for(url)
    try:
        with pytest.raises(HopError):
            await client.post("chat/completions", b"{}")
    finally:
        await client.aclose()


async def test_the_health_check_gets_the_status(raw: tuple[RawUpstream, str]) -> None:
    upstream, url = raw
    upstream.answers.append([b"HTTP/1.1 503 X\r\ncontent-length: 4\r\n\r\nbusy"])
    client = client_for(url)
    try:
        assert await client.get_status("/models", 5.0) == 503
    finally:
        await client.aclose()
    assert upstream.requests[0][0].startswith(b"GET /v1/models ")


async def test_a_silent_health_check_runs_out_of_time(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    upstream.answers.append([])  # read the request, never answer
    client = client_for(url)
    try:
        with pytest.raises(HopError):
            await client.get_status("/models", 0.2)
    finally:
        await client.aclose()


async def test_the_health_checks_run_on_the_engines_clock(
    raw: tuple[RawUpstream, str],
) -> None:
    upstream, url = raw
    busy = b"HTTP/1.1 503 X\r\ncontent-length: 4\r\n\r\nbusy"
    upstream.answers += [[busy], [b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"]]
    clock = ManualClock()
    config = UpstreamConfig(url, health_path="/models")
    engine = UpstreamEngine(MODEL, [config], health_interval_s=5, timers=clock)

    def healthy() -> list[bool]:
        return [c.healthy for c in engine.upstream_counters()]

    try:
        assert engine.pool is not None  # made on the loop: the checks start
        await wait_until(lambda: healthy() == [False] and clock.next_due == 5.0, 5)
        assert len(upstream.requests) == 1  # nothing more before the clock moves
        clock.advance(5)
        await wait_until(lambda: healthy() == [True], 5)
    finally:
        await engine.aclose()
    assert [head.split(b"\r\n")[0] for head, _ in upstream.requests] == [
        b"GET /v1/models HTTP/1.1"
    ] * 2


# -- the engine against a real scripted sluicegate --------------------------------

MODEL = ModelInfo("scripted", 4096, 0)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("hop")
    text = folder / "story.txt"
    text.write_text("once upon a time, caf\u00e9 \u6f22\u5b57 " * 300, encoding="utf-8")
    port = free_port()
    command = serve_command(
        port,
        "--engine",
        "scripted",
        "--scripted-rate",
        "50",
        "--scripted-text",
        str(text),
        "--no-ledger",
        "--log-level",
        "warning",
    )
    with ServerProcess(command, port, log_path=folder / "scripted.log") as server:
        server.wait_ready()
        yield server


def request(request_id: str, max_tokens: int) -> GenerateRequest:
    messages = ({"role": "user", "content": "hi"},)
    prompt = TextPrompt(Endpoint.CHAT, messages=messages, max_tokens=max_tokens)
    return GenerateRequest(request_id, (), SamplingParams(max_tokens), prompt)


def engine_over(server: ServerProcess) -> UpstreamEngine:
    config = UpstreamConfig(
        server.base_url + "/v1", continuous_usage=True, timeouts=UpstreamTimeouts()
    )
    return UpstreamEngine(MODEL, [config], health_interval_s=0)


async def test_the_engine_gives_the_upstreams_text_and_counts(
    scripted: ServerProcess,
) -> None:
    engine = engine_over(scripted)
    try:
        outputs = engine.generate(request("r1", 24))
        await outputs.accepted()
        got: list[TextOutput] = [output async for output in outputs]
    finally:
        await engine.aclose()
    assert got[-1].finish_reason is FinishReason.LENGTH
    assert sum(o.completion_tokens for o in got) == 24
    assert "".join(o.text for o in got).startswith("once upon a time, caf\u00e9")


async def test_a_close_reaches_the_upstream(scripted: ServerProcess) -> None:
    engine = engine_over(scripted)
    admin = httpx.AsyncClient(base_url=scripted.base_url)
    try:
        before = (await admin.get("/engine/stats")).json()
        outputs = engine.generate(request("r2", 2000))
        await outputs.accepted()
        assert (await outputs.__anext__()).text
        closed_at = time.monotonic()
        outputs.close()
        while True:
            stats = (await admin.get("/engine/stats")).json()
            elapsed = time.monotonic() - closed_at
            if (
                stats["aborted_requests"] == before["aborted_requests"] + 1
                and stats["running"] == 0
            ):
                break
            assert elapsed < GIVE_UP_S, stats
            await asyncio.sleep(0.01)
        assert elapsed <= ABORT_WITHIN_S, f"aborted {elapsed:.2f} s after close()"
    finally:
        await admin.aclose()
        await engine.aclose()


def test_a_config_file_that_names_an_http_client_is_refused(tmp_path: Path) -> None:
    from sluicegate.engines.upstream.file import engines_from_file

    path = tmp_path / "upstreams.toml"
    path.write_text(
        '[[models]]\nid = "m"\nhttp_client = "httpx"\n'
        '[[models.upstreams]]\nurl = "http://127.0.0.1:9/v1"\n',
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"unknown settings \['http_client'\]"):
        engines_from_file(path, {})


async def test_metrics_have_each_upstreams_streams_and_first_tokens(
    scripted: ServerProcess,
) -> None:
    url = scripted.base_url + "/v1"
    config = UpstreamConfig(url, model="scripted", max_streams=7, health_path="")
    engine = UpstreamEngine(
        ModelInfo("pooled", 0, int(time.time())), [config], health_interval_s=0
    )
    app = create_app(engine, ServerConfig())
    gateway = httpx.ASGITransport(app=app)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with httpx.AsyncClient(transport=gateway, base_url="http://t") as client:
        for _ in range(2):
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
        # The upstream's stream is let go just after the gateway's answer.
        await wait_until(lambda: engine.upstream_counters()[0].in_flight == 0, 5)
        metrics = (await client.get("/metrics")).text
    await engine.aclose()
    labels = f'model="pooled",upstream="{url}"'
    assert f"sluicegate_upstream_streams_total{{{labels}}} 2.0" in metrics
    assert f"sluicegate_upstream_in_flight{{{labels}}} 0.0" in metrics
    assert f"sluicegate_upstream_max_streams{{{labels}}} 7.0" in metrics
    assert f"sluicegate_upstream_failures_total{{{labels}}} 0.0" in metrics
    assert f"sluicegate_upstream_time_to_first_token_seconds_count{{{labels}}} 2.0" in (
        metrics
    )
