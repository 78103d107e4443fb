"""UpstreamEngine against real servers: a scripted sluicegate, and a fault upstream.

The fault upstream is a raw asyncio HTTP/1.1 server in the test's own loop: each
test gives it the exact bytes to answer with (quirky streams, a 429 with
``Retry-After``, a reset mid-stream), so what the engine makes of them is
checked byte for byte. The scripted sluicegate is a real ``sluicegate serve``
process: its ``/engine/stats`` shows whether an abort reached it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from sluicegate.core.errors import (
    EngineError,
    EngineRefused,
    EngineTimeout,
    EngineUnavailable,
    UpstreamProtocolError,
)
from sluicegate.core.events import FinishReason, TextOutput, ToolCallFragment
from sluicegate.core.upstream.limits import ReaderLimits
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.engines.base import (
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    TextPrompt,
)
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.upstream.config import UpstreamConfig, UpstreamTimeouts
from sluicegate.engines.upstream.engine import UpstreamEngine, UpstreamOutputs
from sluicegate.server.http.answers import status_of
from sluicegate.testing import ServerProcess, free_port, serve_command

pytestmark = pytest.mark.anyio

MODEL = ModelInfo("toy", 4096, 0)
ABORT_WITHIN_S = 1.0
"""How soon the upstream must list an aborted request (docs/DESIGN.md, "Engine
protocol"), measured from ``close()``."""
GIVE_UP_S = 10.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real sluicegate on the scripted engine: 20 tokens/s of a long text."""
    folder = tmp_path_factory.mktemp("upstream")
    text = folder / "story.txt"
    text.write_text("once upon a time " * 400, encoding="utf-8")
    port = free_port()
    command = serve_command(
        port,
        "--engine",
        "scripted",
        "--scripted-rate",
        "20",
        "--scripted-text",
        str(text),
        "--no-ledger",
        "--log-level",
        "warning",
    )
    with ServerProcess(command, port, log_path=folder / "scripted.log") as server:
        server.wait_ready()
        yield server


def chat_request(request_id: str = "r1", max_tokens: int = 5) -> GenerateRequest:
    messages = ({"role": "user", "content": "hi"},)
    prompt = TextPrompt(Endpoint.CHAT, messages=messages, max_tokens=max_tokens)
    return GenerateRequest(request_id, (), SamplingParams(max_tokens), prompt)


def engine_for(*urls: str, **options: Any) -> UpstreamEngine:
    timeouts = options.pop("timeouts", UpstreamTimeouts())
    model = options.pop("model", "toy")
    configs = [
        UpstreamConfig(url, model=model, continuous_usage=True, timeouts=timeouts)
        for url in urls
    ]
    options.setdefault("health_interval_s", 0)
    return UpstreamEngine(MODEL, configs, **options)


async def collect(outputs: UpstreamOutputs) -> list[TextOutput]:
    return [output async for output in outputs]


# -- the fault upstream --------------------------------------------------------

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
UNTIL_CLOSED = -1.0
"""A piece of ``stream``: send nothing more until the client closes."""


class FaultUpstream:
    """Answers each request with the next script; records what was asked."""

    def __init__(self) -> None:
        self.scripts: list[Script] = []
        self.bodies: list[dict[str, Any]] = []
        self.heads: list[bytes] = []
        self.closed = asyncio.Event()

    async def serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.lower() == b"content-length":
                        length = int(value)
                self.bodies.append(orjson.loads(await reader.readexactly(length)))
                await self.scripts.pop(0)(reader, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.closed.set()
            writer.close()


def status(code: int, body: bytes, *headers: str) -> Script:
    async def script(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        extra = "".join(f"{h}\r\n" for h in headers)
        writer.write(
            f"HTTP/1.1 {code} X\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode()
            + body
        )
        await writer.drain()

    return script


def stream(*pieces: bytes | float, reset: bool = False, end: bool = True) -> Script:
    """A chunked 200 event stream of ``pieces`` (a float: sleep that long)."""

    async def script(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for piece in pieces:
            if piece == UNTIL_CLOSED:
                await writer.drain()
                await reader.read()  # b"" at the client's close
                return
            if isinstance(piece, float):
                await writer.drain()
                await asyncio.sleep(piece)
                continue
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
        if reset:
            writer.transport.abort()
        elif end:
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    return script


def data(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def delta(text: str, finish: str | None = None) -> bytes:
    return data(
        {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
    )


USAGE = data({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
DONE = b"data: [DONE]\n\n"


@pytest.fixture
async def fault() -> AsyncIterator[tuple[FaultUpstream, str]]:
    upstream = FaultUpstream()
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield upstream, f"http://127.0.0.1:{port}/v1"
        server.close()


# -- against the scripted sluicegate --------------------------------------------


async def test_a_stream_from_a_real_sluicegate(scripted: ServerProcess) -> None:
    engine = engine_for(scripted.base_url + "/v1", model="scripted")
    try:
        outputs = engine.generate(chat_request(max_tokens=6))
        await outputs.accepted()
        items = await collect(outputs)
    finally:
        await engine.aclose()
    assert items[-1].finish_reason is FinishReason.LENGTH
    assert items[-1].prompt_tokens is not None
    assert sum(o.completion_tokens for o in items) == 6
    assert "".join(o.text for o in items).startswith("once upon")
    assert engine.stats().finished_requests == 1
    assert engine.stats().generated_tokens == 6


async def test_close_aborts_the_request_upstream(scripted: ServerProcess) -> None:
    engine = engine_for(scripted.base_url + "/v1", model="scripted")
    admin = httpx.AsyncClient(base_url=scripted.base_url)
    try:
        before = (await admin.get("/engine/stats")).json()
        request = chat_request(max_tokens=2000)
        first_request_id = request.request_id
        outputs = engine.generate(request)
        await outputs.accepted()
        first = await outputs.__anext__()
        assert first.text
        closed_at = time.monotonic()
        outputs.close()
        while True:
            stats = (await admin.get("/engine/stats")).json()
            elapsed = time.monotonic() - closed_at
            if (
                stats["aborted_requests"] == before["aborted_requests"] + 1
                and stats["running"] == 0
                and stats["kv_cells_used"] == 0
            ):
                break
            assert elapsed < GIVE_UP_S, stats
            await asyncio.sleep(0.01)
        assert elapsed <= ABORT_WITHIN_S, f"aborted {elapsed:.2f} s after close()"
        mine = engine.stats()
        assert (mine.aborted_requests, mine.running) == (1, 0)
        assert mine.aborted_ids == (first_request_id,)
    finally:
        await admin.aclose()
        await engine.aclose()


async def test_a_sequence_stopped_by_the_server_counts_as_finished(
    scripted: ServerProcess,
) -> None:
    engine = engine_for(scripted.base_url + "/v1", model="scripted")
    try:
        request = chat_request(max_tokens=2000)
        outputs = engine.generate(request)
        await outputs.accepted()
        assert (await outputs.__anext__()).text
        engine.abort(request.request_id, stopped=True)
        with anyio.fail_after(GIVE_UP_S):
            await collect(outputs)  # ends: the upstream stream was closed
        stats = engine.stats()
        assert (stats.finished_requests, stats.aborted_requests) == (1, 0)
        assert stats.aborted_ids == ()
    finally:
        await engine.aclose()


# -- against the fault upstream ---------------------------------------------------


async def test_quirks_become_clean_outputs(fault: tuple[FaultUpstream, str]) -> None:
    upstream, url = fault
    upstream.scripts.append(
        stream(
            b"\xef\xbb\xbf: keep-alive\r\n\r\n",
            data({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
            b"event: message\r\n" + delta("Hel").replace(b"\n", b"\r\n"),
            delta("Hello"),
            delta("Hello!", ""),
            delta("", "stop"),
            USAGE,
            DONE,
            DONE,
        )
    )
    engine = engine_for(url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        items = await collect(outputs)
    finally:
        await engine.aclose()
    assert "".join(o.text for o in items) == "Hello!"
    assert items[-1].finish_reason is FinishReason.STOP
    assert items[-1].prompt_tokens == 9
    assert sum(o.completion_tokens for o in items) == 2
    body = upstream.bodies[0]
    assert body["stream"] is True
    assert body["n"] == 1
    assert body["model"] == "toy"
    assert body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert b"POST /v1/chat/completions" in upstream.heads[0]


async def test_a_429_is_a_503_with_its_retry_after(
    fault: tuple[FaultUpstream, str],
) -> None:
    """An upstream's 429 is the gateway's own limit there, not the client's:
    the client gets 503 with the wait, and none of the upstream's words."""
    upstream, url = fault
    error = orjson.dumps({"error": {"message": "slow down", "code": "rate_limited"}})
    upstream.scripts.append(status(429, error, "retry-after: 7"))
    engine = engine_for(url)
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused) as refused:
            await outputs.accepted()
    finally:
        await engine.aclose()
    assert refused.value.status == 503
    assert refused.value.retry_after_s == 7
    assert refused.value.error_code is None
    assert str(refused.value) == "the upstream is overloaded (429); retry later"


async def test_a_context_overflow_is_a_400_with_the_upstream_message(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    message = "This model's maximum context length is 4096 tokens"
    upstream.scripts.append(
        status(400, orjson.dumps({"object": "error", "message": message, "code": 400}))
    )
    engine = engine_for(url, url)  # a 4xx is not tried elsewhere
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused) as refused:
            await outputs.accepted()
        with pytest.raises(EngineRefused):
            await collect(outputs)
    finally:
        await engine.aclose()
    assert (refused.value.status, str(refused.value)) == (400, message)
    assert len(upstream.bodies) == 1


async def test_a_refusal_before_content_fails_over(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    dead = f"http://127.0.0.1:{free_port()}/v1"
    upstream.scripts += [
        status(503, b"busy", "retry-after: 1"),
        stream(delta("ok", "stop"), USAGE, DONE),
    ]
    engine = engine_for(dead, url, url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        items = await collect(outputs)
        counters = engine.upstream_counters()
    finally:
        await engine.aclose()
    assert "".join(o.text for o in items) == "ok"
    assert [c.failures_total for c in counters] == [1, 0, 0]
    assert sum(c.refusals_total for c in counters) == 1


async def test_no_reachable_upstream_is_unavailable() -> None:
    engine = engine_for(f"http://127.0.0.1:{free_port()}/v1")
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineUnavailable):
            await outputs.accepted()
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (stream(delta("a"), reset=True), "broke"),
        (stream(delta("a")), r"without \[DONE\]"),
        (stream(delta("a"), data({"error": {"message": "oom"}})), "oom"),
        (stream(delta("a"), DONE), "without a finish_reason"),
    ],
)
async def test_a_failure_after_content_is_an_error_item(
    fault: tuple[FaultUpstream, str], script: Script, message: str
) -> None:
    upstream, url = fault
    upstream.scripts.append(script)
    engine = engine_for(url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        assert (await outputs.__anext__()).text == "a"
        with pytest.raises(EngineError, match=message):
            await outputs.__anext__()
    finally:
        await engine.aclose()
    assert engine.stats().failed_requests == 1


async def test_an_upstream_silent_past_the_idle_limit_times_out(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    upstream.scripts.append(stream(delta("a"), UNTIL_CLOSED))
    timeouts = UpstreamTimeouts(idle_s=0.2)
    engine = engine_for(url, timeouts=timeouts)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        assert (await outputs.__anext__()).text == "a"
        with pytest.raises(EngineTimeout, match="idle"):
            await outputs.__anext__()
        await asyncio.wait_for(upstream.closed.wait(), GIVE_UP_S)
    finally:
        await engine.aclose()


async def test_the_connection_is_kept_alive_between_streams(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    for _ in range(3):
        upstream.scripts.append(stream(delta("x", "stop"), USAGE, DONE))
    engine = engine_for(url)
    try:
        for i in range(3):
            await collect(engine.generate(chat_request(f"r{i}")))
    finally:
        await engine.aclose()
    assert len(upstream.bodies) == 3
    assert not upstream.closed.is_set() or len(upstream.heads) == 3


def test_a_config_dict_builds_the_engine(tmp_path: Path) -> None:
    engine = UpstreamEngine.from_config(
        MODEL,
        [
            {
                "url": "http://10.0.0.5:8000/v1/",
                "api_key_env": "KEY",
                "max_streams": 8,
                "model": "meta/llama",
                "first_token_timeout_s": 30,
                "total_timeout_s": None,
            }
        ],
        {"KEY": "secret"},
    )
    (upstream,) = engine._upstreams
    assert upstream.url == "http://10.0.0.5:8000/v1"
    assert upstream.api_key == "secret"
    assert upstream.timeouts.first_token_s == 30.0
    with pytest.raises(ValueError, match="unknown"):
        UpstreamEngine.from_config(MODEL, [{"url": "http://x", "speed": 1}], {})
    with pytest.raises(ValueError, match="api_key_env"):
        UpstreamEngine.from_config(
            MODEL, [{"url": "http://x", "api_key_env": "NO"}], {}
        )


# -- accepted at the first content, not at the 200 ---------------------------------

ROLE = data({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})


def closed_mid_body(*pieces: bytes) -> Script:
    """A chunked 200 whose connection closes (FIN) after ``pieces``, the body
    unfinished: the client reads them, then the break."""

    async def script(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for piece in pieces:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        await writer.drain()
        writer.close()

    return script


BEFORE_CONTENT = [
    pytest.param(closed_mid_body(ROLE), "broke", id="closed"),
    pytest.param(stream(ROLE), r"without \[DONE\]", id="ended"),
    pytest.param(stream(ROLE, data({"error": {"message": "oom"}})), "oom", id="error"),
    pytest.param(stream(ROLE, DONE), "without a finish_reason", id="done"),
]


@pytest.mark.parametrize(("script", "message"), BEFORE_CONTENT)
async def test_a_200_that_fails_before_content_is_a_502_before_any_output(
    fault: tuple[FaultUpstream, str],
    script: Script,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client's message is ours; the upstream's words go to the log."""
    upstream, url = fault
    upstream.scripts.append(script)
    engine = engine_for(url)
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused) as refused:
            await outputs.accepted()
        with pytest.raises(EngineRefused):
            await collect(outputs)
        counters = engine.upstream_counters()
    finally:
        await engine.aclose()
    assert status_of(refused.value) == 502
    assert str(refused.value) == "the upstream failed before any content"
    assert re.search(message, caplog.text)
    assert url in caplog.text  # the log names the upstream
    assert [c.failures_total for c in counters] == [1]
    assert engine.stats().failed_requests == 1


@pytest.mark.parametrize(("script", "message"), BEFORE_CONTENT)
async def test_a_200_that_fails_before_content_fails_over(
    fault: tuple[FaultUpstream, str], script: Script, message: str
) -> None:
    upstream, url = fault
    upstream.scripts += [script, stream(ROLE, delta("ok", "stop"), USAGE, DONE)]
    engine = engine_for(url, url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        items = await collect(outputs)
        counters = engine.upstream_counters()
    finally:
        await engine.aclose()
    assert "".join(o.text for o in items) == "ok"
    assert items[-1].finish_reason is FinishReason.STOP
    assert sum(o.completion_tokens for o in items) == 2  # the answer's own usage
    assert [c.failures_total for c in counters] == [1, 0]
    assert len(upstream.bodies) == 2


async def test_the_usage_of_a_stream_that_failed_before_content_is_not_counted(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    usage = {"prompt_tokens": 9, "completion_tokens": 40}
    upstream.scripts += [
        stream(ROLE, data({"choices": [], "usage": usage})),
        stream(delta("ok"), delta("", "stop"), DONE),
    ]
    engine = engine_for(url, url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        items = await collect(outputs)
    finally:
        await engine.aclose()
    # The answer's own usage never came: the prompt's estimate is said before
    # its end (so the usage is marked estimated), never the failed stream's 9.
    assert [o.completion_tokens for o in items] == [1, 0, 0]
    assert items[-1].prompt_tokens is None
    assert items[-2].prompt_tokens not in (None, 9)


async def test_an_in_band_status_before_content_is_that_status(
    fault: tuple[FaultUpstream, str],
) -> None:
    """vLLM puts an HTTP status in an in-band error's code: a 4xx is the
    client's answer, and no other upstream is asked."""
    upstream, url = fault
    error = {"object": "error", "message": "too long", "type": "BadRequestError"}
    upstream.scripts.append(stream(data({**error, "code": 400})))
    engine = engine_for(url, url)
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused) as refused:
            await outputs.accepted()
    finally:
        await engine.aclose()
    assert (refused.value.status, str(refused.value)) == (400, "too long")
    assert len(upstream.bodies) == 1


async def test_an_empty_answer_is_accepted_at_its_finish(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    upstream.scripts.append(stream(ROLE, delta("", "stop"), USAGE, DONE))
    engine = engine_for(url)
    try:
        outputs = engine.generate(chat_request())
        await outputs.accepted()
        items = await collect(outputs)
    finally:
        await engine.aclose()
    assert [(o.text, o.finish_reason) for o in items] == [("", FinishReason.STOP)]


# -- tool calls ------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {"name": "get_time"}}]


def call_delta(*calls: dict[str, Any], finish: str | None = None) -> bytes:
    return data(
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": list(calls)},
                    "finish_reason": finish,
                }
            ]
        }
    )


async def test_tool_calls_pass_through_normalized(
    fault: tuple[FaultUpstream, str],
) -> None:
    """An upstream that repeats the id and name on every chunk: each comes once."""
    upstream, url = fault
    call = {"index": 0, "id": "call_u", "type": "function"}
    upstream.scripts.append(
        stream(
            ROLE,
            call_delta({**call, "function": {"name": "get_time", "arguments": "{"}}),
            call_delta({**call, "function": {"name": "get_time", "arguments": "}"}}),
            call_delta(finish="tool_calls"),
            data(
                {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}
            ),
            DONE,
        )
    )
    extra = {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    prompt = TextPrompt(
        Endpoint.CHAT,
        ({"role": "user", "content": "time?"},),
        extra=extra,
        tool_names=frozenset({"get_time"}),
    )
    engine = engine_for(url)
    try:
        outputs = engine.generate(GenerateRequest("r1", (), SamplingParams(5), prompt))
        await outputs.accepted()
        items = await collect(outputs)
    finally:
        await engine.aclose()
    assert [f for o in items for f in o.tool_calls] == [
        ToolCallFragment(0, "call_u", "get_time"),
        ToolCallFragment(0, arguments="{"),
        ToolCallFragment(0, arguments="}"),
    ]
    assert all(o.text == "" for o in items)
    assert items[-1].finish_reason is FinishReason.TOOL_CALLS
    assert sum(o.completion_tokens for o in items) == 5
    body = upstream.bodies[0]
    assert {k: body[k] for k in extra} == extra


async def test_no_content_within_the_first_token_limit_is_a_504(
    fault: tuple[FaultUpstream, str],
) -> None:
    """A 200 and the role chunk, then silence: the status waits, then says 504."""
    upstream, url = fault
    upstream.scripts.append(stream(ROLE, UNTIL_CLOSED))
    engine = engine_for(url, timeouts=UpstreamTimeouts(first_token_s=0.2))
    try:
        outputs = engine.generate(chat_request())
        with pytest.raises(EngineRefused, match="time to first token") as refused:
            await outputs.accepted()
        await asyncio.wait_for(upstream.closed.wait(), GIVE_UP_S)
    finally:
        await engine.aclose()
    assert status_of(refused.value) == 504


# -- a hostile upstream: bounds, tools not offered, usage that cannot be true ----


def tool_request(names: frozenset[str], max_tokens: int | None = 5) -> GenerateRequest:
    prompt = TextPrompt(
        Endpoint.CHAT,
        ({"role": "user", "content": "time?"},),
        max_tokens=max_tokens,
        extra={"tools": TOOLS},
        tool_names=names,
    )
    return GenerateRequest("r1", (), SamplingParams(5), prompt)


async def test_a_call_to_a_tool_not_offered_after_content_is_a_protocol_error(
    fault: tuple[FaultUpstream, str],
) -> None:
    """Text, then a call naming another tool: the sequence fails with code
    ``upstream_protocol_error``; no fragment of the call goes out, and the
    connection is closed."""
    upstream, url = fault
    call = {"index": 0, "id": "call_x", "type": "function"}
    upstream.scripts.append(
        stream(
            delta("hi"),
            call_delta({**call, "function": {"name": "rm_rf", "arguments": "{}"}}),
            UNTIL_CLOSED,
        )
    )
    engine = engine_for(url)
    try:
        outputs = engine.generate(tool_request(frozenset({"get_time"})))
        await outputs.accepted()
        first = await anext(outputs)
        with pytest.raises(UpstreamProtocolError, match="'rm_rf'") as failed:
            await anext(outputs)
        await asyncio.wait_for(upstream.closed.wait(), GIVE_UP_S)
    finally:
        await engine.aclose()
    assert failed.value.code == "upstream_protocol_error"
    assert (first.text, first.tool_calls) == ("hi", ())


async def test_a_call_to_a_tool_not_offered_before_content_is_a_502(
    fault: tuple[FaultUpstream, str],
) -> None:
    upstream, url = fault
    call = {"index": 0, "id": "call_x", "type": "function"}
    upstream.scripts.append(
        stream(call_delta({**call, "function": {"name": "rm_rf", "arguments": "{"}}))
    )
    engine = engine_for(url)
    try:
        outputs = engine.generate(tool_request(frozenset()))
        with pytest.raises(EngineRefused, match="did not offer") as refused:
            await outputs.accepted()
    finally:
        await engine.aclose()
    assert status_of(refused.value) == 502


async def test_a_chunk_past_a_bound_ends_the_stream_and_closes_the_connection(
    fault: tuple[FaultUpstream, str],
) -> None:
    """After content, a chunk of more deltas than ``max_deltas_per_chunk``: the
    sequence fails with ``upstream_protocol_error``, and the upstream sees its
    connection closed although it never ended its body."""
    upstream, url = fault
    entries = [{"index": 0, "function": {"arguments": "x"}}] * 9
    upstream.scripts.append(stream(delta("hi"), call_delta(*entries), UNTIL_CLOSED))
    limits = ReaderLimits(max_deltas_per_chunk=8)
    engine = UpstreamEngine(
        MODEL,
        [UpstreamConfig(url, model="toy", limits=limits)],
        health_interval_s=0,
    )
    try:
        outputs = engine.generate(tool_request(frozenset({"get_time"})))
        await outputs.accepted()
        with pytest.raises(UpstreamProtocolError, match="more than 8 deltas"):
            await collect(outputs)
        await asyncio.wait_for(upstream.closed.wait(), GIVE_UP_S)
    finally:
        await engine.aclose()


@pytest.mark.parametrize(
    "usage",
    [
        '{"prompt_tokens": 9, "completion_tokens": 9000000000000000000}',
        '{"prompt_tokens": 1180591620717411303424, "completion_tokens": 2}',
        '{"prompt_tokens": 9, "completion_tokens": 6}',  # past max_tokens 5
        '{"prompt_tokens": 4095, "completion_tokens": 2}',  # past the window
        '{"prompt_tokens": -9, "completion_tokens": 2}',
        '{"prompt_tokens": 9.5, "completion_tokens": 2}',
    ],
)
async def test_a_usage_that_cannot_be_true_is_replaced_by_our_count(
    fault: tuple[FaultUpstream, str], usage: str
) -> None:
    """The sequence finishes; its outputs count one token per text and no
    prompt tokens (so the server marks the usage estimated), and the upstream's
    ``usage_rejected`` counter says so."""
    upstream, url = fault
    usage_chunk = b'data: {"choices": [], "usage": %b}\n\n' % usage.encode()
    upstream.scripts.append(stream(delta("a"), delta("b", "stop"), usage_chunk, DONE))
    engine = engine_for(url)
    try:
        outputs = engine.generate(tool_request(frozenset(), max_tokens=5))
        await outputs.accepted()
        items = await collect(outputs)
        await asyncio.sleep(0.05)  # the sequence's task ends after its last item
        counters = engine.upstream_counters()
    finally:
        await engine.aclose()
    assert items[-1].finish_reason is FinishReason.STOP
    assert items[-1].prompt_tokens is None
    assert sum(o.completion_tokens for o in items) == 2
    assert [c.usage_rejected_total for c in counters] == [1]


@pytest.mark.parametrize(("count_s", "want"), [(0.1, "estimate"), (10.0, "count")])
async def test_a_count_before_the_first_event_waits_no_longer_than_its_limit(
    fault: tuple[FaultUpstream, str], count_s: float, want: str
) -> None:
    """The estimate's wait for the upstream's counter was 0.5 s even when the
    upstream's ``count_timeout_s`` was shorter. On a stepped clock: past
    ``count_s`` (0.1 s) the estimate stands in, and the count that comes then
    is not waited for; with a longer limit the count, come by 0.1 s, is taken."""
    upstream, url = fault
    asked, release = asyncio.Event(), asyncio.Event()
    count = b'{"count": 1000}'

    async def late_count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        asked.set()
        await release.wait()
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(count)}\r\n\r\n"
        writer.write(head.encode() + count)
        await writer.drain()

    upstream.scripts.append(late_count)
    clock = ManualClock()
    timeouts = UpstreamTimeouts(count_s=count_s)
    engine = engine_for(url, timeouts=timeouts, timers=clock)
    try:
        counting = asyncio.create_task(
            engine.count_prompt(chat_request(), {}, estimate=True)
        )
        await asyncio.wait_for(asked.wait(), GIVE_UP_S)
        clock.advance(0.1)
        release.set()
        counted = await asyncio.wait_for(counting, GIVE_UP_S)
    finally:
        await engine.aclose()
    assert upstream.heads[0].startswith(b"POST /tokenize ")
    assert (counted == 1000) is (want == "count"), counted
