"""What an upstream's refusal becomes over the hop: statuses through
the table, redirects never followed, ``Retry-After`` clamped, in-band codes of
any type, and no secret in anything the client or the log sees.

The upstream is a raw asyncio HTTP/1.1 server in the test's own loop that
answers each request with bytes made from what it was sent (so it can echo the
``Authorization`` it got, as real upstreams do) and records each request line.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Callable
from urllib.parse import quote

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.core.errors import EngineError, EngineRefused, EngineUnavailable
from sluicegate.core.events import TextOutput
from sluicegate.core.upstream.hop_answers import (
    DEFAULT_RETRY_AFTER_S,
    MAX_RETRY_AFTER_S,
)
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import (
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    TextPrompt,
)
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.engine import UpstreamEngine
from sluicegate.server.http.answers import status_of

pytestmark = pytest.mark.anyio

MODEL = ModelInfo("toy", 4096, 0)
KEY = "sk-test-Zq9/+=&%key"

Answer = Callable[[bytes], bytes]
"""The bytes to answer with, from the request's head."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class EchoUpstream:
    """Answers each request with ``answer(head)``, then closes; records the
    request lines."""

    def __init__(self) -> None:
        self.answer: Answer = lambda head: b""
        self.lines: list[bytes] = []

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.lines.append(head.split(b"\r\n", 1)[0])
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            writer.write(self.answer(head))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def started() -> tuple[EchoUpstream, asyncio.Server, str]:
    upstream = EchoUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return upstream, server, f"http://127.0.0.1:{port}/v1"


@pytest.fixture
async def echo() -> AsyncIterator[tuple[EchoUpstream, str]]:
    upstream, server, url = await started()
    async with server:
        yield upstream, url
        server.close()


def key_of(head: bytes) -> bytes:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.lower() == b"authorization":
            return value.strip().removeprefix(b"Bearer ")
    return b"no key"


def http(status: bytes, body: bytes, *headers: bytes) -> bytes:
    head = [status, b"content-length: " + str(len(body)).encode(), *headers]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def sse(*events: object) -> bytes:
    body = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return http(b"HTTP/1.1 200 OK", body, b"content-type: text/event-stream")


def chat_request() -> GenerateRequest:
    messages = ({"role": "user", "content": "hi"},)
    prompt = TextPrompt(Endpoint.CHAT, messages=messages, max_tokens=5)
    return GenerateRequest("r1", (), SamplingParams(5), prompt)


def engine_for(*urls: str, key: str | None = KEY) -> UpstreamEngine:
    configs = [UpstreamConfig(u, model="toy", api_key=key) for u in urls]
    return UpstreamEngine(MODEL, configs, health_interval_s=0)


async def refusal(engine: UpstreamEngine) -> EngineError:
    """The error ``accepted()`` raises (and the sequence ends with)."""
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineError) as raised:
            await outputs.accepted()
        async with asyncio.timeout(10):
            with pytest.raises(EngineError):
                async for _ in outputs:
                    pass
    finally:
        await engine.aclose()
    return raised.value


def error_body(message: bytes, **fields: bytes | str) -> bytes:
    texts = {k: v.decode() if isinstance(v, bytes) else v for k, v in fields.items()}
    error = {"message": message.decode("latin-1"), **texts}
    return orjson.dumps({"error": error})


# -- statuses --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "client_status"),
    [
        (407, 502),
        (408, 502),
        (418, 502),
        (401, 502),
        (404, 502),
        (500, 502),
        (204, 502),
        (299, 502),
        (999, 502),
        (413, 413),
        (422, 400),
        (504, 504),
    ],
)
async def test_an_odd_status_never_reaches_the_client_as_it_came(
    echo: tuple[EchoUpstream, str], status: int, client_status: int
) -> None:
    upstream, url = echo
    upstream.answer = lambda head: http(
        b"HTTP/1.1 %d Odd" % status, error_body(b"odd", code="odd_code")
    )
    error = await refusal(engine_for(url))
    assert isinstance(error, EngineRefused)
    assert status_of(error) == client_status
    if client_status >= 500:
        assert "odd" not in str(error)  # the upstream's words stay in the log
        assert error.error_code is None
    else:
        assert (str(error), error.error_code) == ("odd", "odd_code")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_a_redirect_is_a_502_and_never_followed(
    echo: tuple[EchoUpstream, str],
    status: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream, url = echo
    other, server, other_url = await started()
    other.answer = lambda head: sse({"choices": [{"delta": {"content": "other"}}]})
    secret = quote(KEY, safe="")
    location = other_url.replace("http://", f"http://user:{secret}@") + "?t=" + secret
    upstream.answer = lambda head: http(
        b"HTTP/1.1 %d Moved" % status, b"", b"location: " + location.encode()
    )
    async with server:
        error = await refusal(engine_for(url))
        server.close()
    assert isinstance(error, EngineRefused)
    assert error.status == 502
    assert str(error) == (
        f"the upstream answered with a redirect ({status}); redirects are not followed"
    )
    assert other.lines == []  # the other host never heard of it
    assert upstream.lines == [b"POST /v1/chat/completions HTTP/1.1"]  # no GET
    assert KEY not in caplog.text
    assert secret not in caplog.text


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (b"retry-after: 7", 7.0),
        (b"retry-after: 1000000000", MAX_RETRY_AFTER_S),
        (b"retry-after: Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S),
        (b"retry-after: soon", DEFAULT_RETRY_AFTER_S),
        (b"x-other: 1", DEFAULT_RETRY_AFTER_S),
    ],
)
@pytest.mark.parametrize("status", [429, 503])
async def test_an_overloaded_upstream_is_a_503_with_a_clamped_retry_after(
    echo: tuple[EchoUpstream, str],
    status: int,
    header: bytes,
    seconds: float,
) -> None:
    upstream, url = echo
    upstream.answer = lambda head: http(
        b"HTTP/1.1 %d Busy" % status, error_body(key_of(head)), header
    )
    error = await refusal(engine_for(url))
    assert isinstance(error, EngineRefused)
    assert (error.status, error.retry_after_s) == (503, seconds)
    assert str(error) == f"the upstream is overloaded ({status}); retry later"


# -- in-band errors before content ---------------------------------------------


@pytest.mark.parametrize(
    ("code", "client_status"),
    [
        ("⁵⁰³", 502),  # Unicode digits int() rejects: still a status, at once
        ("503", 503),
        (503, 503),
        (400, 400),
        ("400", 400),
        (401, 502),
        (503.0, 502),
        (10**30, 502),
        (None, 502),
        ({"status": 503}, 502),
        ("rate_limited", 502),
    ],
)
async def test_an_in_band_code_of_any_type_gives_a_status(
    echo: tuple[EchoUpstream, str], code: object, client_status: int
) -> None:
    upstream, url = echo
    error = {"message": "no", "type": "BadRequestError", "code": code}
    upstream.answer = lambda head: sse({"object": "error", **error})
    async with asyncio.timeout(10):
        raised = await refusal(engine_for(url))
    assert isinstance(raised, EngineRefused)
    assert status_of(raised) == client_status


# -- no valid HTTP answer ----------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        lambda head: b"HTTP/1.1 2OO " + key_of(head) + b"\r\n\r\n",
        lambda head: b"HTTP/1.1 200 OK\r\nx-echo " + key_of(head) + b"\r\n\r\n",
        lambda head: b"NOT HTTP " + key_of(head) + b"\r\n\r\n",
        lambda head: b"",
    ],
    ids=["status-line", "header-line", "not-http", "closed"],
)
async def test_a_malformed_answer_is_a_502_without_its_bytes(
    echo: tuple[EchoUpstream, str],
    answer: Answer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream, url = echo
    upstream.answer = answer
    error = await refusal(engine_for(url))
    assert isinstance(error, EngineRefused)
    assert (status_of(error), str(error)) == (
        502,
        "the upstream failed (no valid HTTP response)",
    )
    assert KEY not in caplog.text
    assert url in caplog.text


async def test_no_connection_is_unavailable_and_names_no_address() -> None:
    _upstream, server, url = await started()
    server.close()
    await server.wait_closed()
    error = await refusal(engine_for(url))
    assert isinstance(error, EngineUnavailable)
    assert str(error) == "the upstream could not be reached"


async def test_metrics_and_logs_name_an_upstream_without_its_secrets(
    echo: tuple[EchoUpstream, str], caplog: pytest.LogCaptureFixture
) -> None:
    upstream, url = echo
    secret_url = url.replace("http://", "http://user:pw-secret@") + "?key=q-secret"
    upstream.answer = lambda head: http(b"HTTP/1.1 500 X", head)
    engine = engine_for(secret_url, key=None)  # userinfo or a key: aiohttp takes one
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused):
            await outputs.accepted()
        names = [c.name for c in engine.upstream_counters()]
    finally:
        await engine.aclose()
    assert names == [url + "?[redacted]"]
    for secret in ("pw-secret", "q-secret"):
        assert secret not in caplog.text
    assert url in caplog.text


# -- the key never leaves ----------------------------------------------------------

# Every way an upstream may echo the key it was given.
ECHOES: dict[str, Answer] = {
    "400 body": lambda k: http(b"HTTP/1.1 400 X", error_body(k, param=k, type=k)),
    "400 code": lambda k: http(b"HTTP/1.1 400 X", error_body(b"m", code=k)),
    "400 text": lambda k: http(b"HTTP/1.1 400 X", b"bad key " + k),
    "401 body": lambda k: http(b"HTTP/1.1 401 X", error_body(b"Incorrect key " + k)),
    "401 reason": lambda k: http(b"HTTP/1.1 401 " + k, b""),
    "429 header": lambda k: http(b"HTTP/1.1 429 X", b"", b"retry-after: " + k),
    "500 body": lambda k: http(b"HTTP/1.1 500 X", k),
    "503 body": lambda k: http(b"HTTP/1.1 503 X", error_body(k)),
    "307 location": lambda k: http(b"HTTP/1.1 307 X", b"", b"location: http://x/" + k),
    "status line": lambda k: b"HTTP/1.1 2OO " + k + b"\r\n\r\n",
    "header line": lambda k: b"HTTP/1.1 200 OK\r\nx " + k + b"\r\n\r\n",
    "in-band before": lambda k: sse({"error": {"message": k.decode(), "code": 400}}),
    "in-band 502": lambda k: sse({"error": {"message": k.decode(), "type": "x"}}),
    "in-band type": lambda k: sse({"error": {"message": "m", "type": k.decode()}}),
    "not json": lambda k: http(b"HTTP/1.1 200 OK", b"data: " + k + b"\n\n"),
    "in-band after": lambda k: sse(
        {"choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {"error": {"message": k.decode(), "code": k.decode()}},
    ),
}

keys = st.text(
    st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'),
    min_size=12,
    max_size=64,
)


def echoing(answer: Answer, head: bytes) -> bytes:
    return answer(key_of(head))


async def client_view(url: str, key: str) -> str:
    """Everything the client may read of one request: the error's message,
    type, code and param, and every output's text."""
    engine = engine_for(url, key=key)
    seen: list[str] = []
    try:
        outputs = engine.generate(chat_request())
        try:
            await outputs.accepted()
            async with asyncio.timeout(10):
                output: TextOutput
                async for output in outputs:
                    seen.append(output.text)
        except EngineError as error:
            seen.append(str(error))
            if isinstance(error, EngineRefused):
                seen += [str(error.error_type), str(error.error_code)]
                seen.append(str(error.param))
    finally:
        await engine.aclose()
    return "\n".join(seen)


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=keys)
async def test_no_echo_of_the_key_reaches_the_client_or_the_log(
    echo: tuple[EchoUpstream, str], key: str, caplog: pytest.LogCaptureFixture
) -> None:
    upstream, url = echo
    for name, answer in ECHOES.items():
        caplog.clear()
        with caplog.at_level(logging.DEBUG):
            upstream.answer = functools.partial(echoing, answer)
            view = await client_view(url, key)
        assert key not in view, name
        assert key not in caplog.text, name
