"""Both clients, test for test: every test runs on ``Client`` and ``AsyncClient``
(the ``client_kind`` fixture), through recorded-style bodies on mock transports."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import httpx
import pytest

from sluicegate.client import TimeoutKind, Timeouts
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import StreamClosed, StreamConsumed
from sluicegate.core.wire.sse import DONE, encode_comment

from .drivers import driver, handled, replaying
from .wire import Cut, Gap, Part, bytewise, chat_frames, error_body, good_body

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "Hi"}]
ROOT = Path(__file__).resolve().parents[2]


async def test_good_stream_fed_byte_by_byte_is_finished(client_kind: str) -> None:
    async with replaying(client_kind, bytewise(good_body())) as client:
        stream = client.stream_chat(MESSAGES, model="m", max_tokens=8)
        texts = await stream.texts()
        result = await stream.result()
    # One delta per content event, however the bytes split.
    assert texts == ["Hel", "lo", " wörld 🤖"]
    assert result.end_state is EndState.FINISHED
    assert result.status == 200
    assert result.timing.first_token_s is not None


async def test_request_body_and_auth_header_are_sent(client_kind: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=good_body())

    async with handled(client_kind, handler, base_url="http://h/v1", api_key="k") as c:
        await c.chat(MESSAGES, model="m", n=1, stop=["x"])
        await c.complete("p", model="m", include_usage=False)
    assert str(seen[0].url) == "http://h/v1/chat/completions"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert json.loads(seen[0].content) == {
        "model": "m",
        "messages": MESSAGES,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
        "stop": ["x"],
    }
    assert str(seen[1].url) == "http://h/v1/completions"
    assert "stream_options" not in json.loads(seen[1].content)


@pytest.mark.parametrize(
    ("parts", "state"),
    [
        (chat_frames(["a"]), EndState.TRUNCATED),
        ([good_body()[:40]], EndState.TRUNCATED),
        ([error_body()], EndState.ERRORED),
        ([chat_frames(["a"])[0], b"data: nope\n\n", DONE], EndState.TRUNCATED),
        ([b"data: {]\n\n", DONE], EndState.TRUNCATED),
    ],
    ids=["no-done", "cut-mid-event", "error-frame", "not-json", "bad-json"],
)
async def test_bad_streams_end_in_their_state(
    client_kind: str, parts: list[bytes], state: EndState
) -> None:
    async with replaying(client_kind, parts) as client:
        assert (await client.chat(MESSAGES, model="m")).end_state is state


async def test_rejected_status_carries_the_error_body(client_kind: str) -> None:
    body = b'{"error": {"message": "bad n", "type": "invalid_request_error"}}'
    async with replaying(client_kind, [body], status=400) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.end_state is EndState.REJECTED
    assert result.status == 400
    assert result.error is not None
    assert result.error["message"] == "bad n"


async def test_rejected_completion_is_rejected(client_kind: str) -> None:
    async with replaying(client_kind, [b"{}"], status=429) as client:
        result = await client.complete("p", model="m")
    assert result.end_state is EndState.REJECTED
    assert result.status == 429


async def test_connection_cut_mid_body_is_truncated_with_the_transport_error(
    client_kind: str,
) -> None:
    parts: list[Part] = [chat_frames(["a"])[0], Cut("peer closed connection")]
    async with replaying(client_kind, parts) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.end_state is EndState.TRUNCATED
    assert result.transport_error is not None
    assert "peer closed" in result.transport_error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (httpx.ConnectTimeout("slow"), TimeoutKind.CONNECT),
        (httpx.ReadTimeout("no head"), TimeoutKind.FIRST_BYTE),
        (httpx.PoolTimeout("no connection free"), TimeoutKind.CONNECT),
    ],
)
async def test_timeouts_before_the_head_are_reported(
    client_kind: str, error: Exception, kind: TimeoutKind
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    async with handled(client_kind, handler) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.timeout is kind
    assert result.status is None
    assert result.end_state is EndState.ABORTED


async def test_connection_refused_is_truncated_without_status(
    client_kind: str,
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    async with handled(client_kind, handler) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.end_state is EndState.TRUNCATED
    assert result.status is None
    assert result.transport_error == "ConnectError: refused"


async def test_idle_gap_longer_than_idle_s_times_out(client_kind: str) -> None:
    frames = chat_frames(["a", "b"])
    parts: list[Part] = [frames[0], frames[1], Gap(5.0), frames[2], DONE]
    async with replaying(client_kind, parts, timeouts=Timeouts(idle_s=1.0)) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.timeout is TimeoutKind.IDLE
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"


async def test_heartbeats_keep_an_idle_limited_stream_alive(client_kind: str) -> None:
    frames = [*chat_frames(["a", "b"]), DONE]
    parts: list[Part] = []
    for piece in frames:  # each silence under the limit, the sum far over it
        parts += [Gap(0.9), encode_comment(), Gap(0.9), piece]
    async with replaying(client_kind, parts, timeouts=Timeouts(idle_s=1.0)) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.end_state is EndState.FINISHED
    assert result.comments == len(frames)


async def test_total_limit_stops_reading(client_kind: str) -> None:
    parts = [*chat_frames(["a", "b"]), DONE]
    async with replaying(client_kind, parts, timeouts=Timeouts(total_s=0.0)) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.timeout is TimeoutKind.TOTAL
    assert result.end_state is EndState.ABORTED


async def test_closing_mid_stream_aborts_and_keeps_what_arrived(
    client_kind: str,
) -> None:
    async with replaying(client_kind, chat_frames(["a", "b", "c"])) as client:
        async with client.stream_chat(MESSAGES, model="m") as stream:
            assert await stream.texts(limit=1) == ["a"]
        result = await stream.result()
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"
    with pytest.raises(StreamClosed):
        stream.start()


async def test_an_interrupt_mid_stream_aborts_it_like_a_close(client_kind: str) -> None:
    async with replaying(client_kind, chat_frames(["a", "b", "c"])) as client:
        stream = client.stream_chat(MESSAGES, model="m")
        assert await stream.texts(limit=1) == ["a"]
        stream.interrupt()  # the mock has no socket: only the flag is set
        result = await stream.result()  # the loop stops before the next chunk
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"
    assert result.transport_error is None


async def test_an_interrupt_before_the_head_reads_no_body(client_kind: str) -> None:
    async with replaying(client_kind, [good_body()]) as client:
        stream = client.stream_chat(MESSAGES, model="m")
        stream.interrupt()
        result = await stream.result()
    assert result.end_state is EndState.ABORTED
    assert result.status == 200
    assert result.text == ""


async def test_closing_before_iterating_sends_nothing(client_kind: str) -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=good_body())

    async with handled(client_kind, handler) as client:
        stream = client.stream_chat(MESSAGES, model="m")
        await stream.close()
        await stream.close()
        assert calls == []
        assert (await stream.result()).end_state is EndState.ABORTED


async def test_iterating_twice_or_after_the_end_is_misuse(client_kind: str) -> None:
    async with replaying(client_kind, [good_body()]) as client:
        stream = client.stream_chat(MESSAGES, model="m")
        stream.start()
        with pytest.raises(StreamConsumed):
            stream.start()
        assert (await stream.result()).end_state is EndState.FINISHED
        with pytest.raises(StreamClosed):
            stream.start()


async def test_closing_an_iterated_unread_stream_aborts_it(client_kind: str) -> None:
    async with replaying(client_kind, [good_body()]) as client:
        stream = client.stream_chat(MESSAGES, model="m")
        stream.start()
        await stream.close()
        assert (await stream.result()).end_state is EndState.ABORTED


async def test_record_keeps_raw_bytes_and_reads_past_done(client_kind: str) -> None:
    body = good_body() + DONE
    client = replaying(client_kind, [body])
    async with client, client.stream_chat(MESSAGES, model="m", record=True) as stream:
        result = await stream.result()
    assert result.raw == body
    assert result.end_state is EndState.FINISHED


def test_base_url_gets_v1_once(client_kind: str) -> None:
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1"):
        made = driver(client_kind, url).client
        assert str(made.http.base_url) == "http://h:8000/v1/"


def test_sync_client_is_generated_from_the_async_one() -> None:
    """``client/sync.py`` is exactly what ``scripts/unasync.py`` makes of ``aio.py``."""
    spec = importlib.util.spec_from_file_location(
        "unasync", ROOT / "scripts/unasync.py"
    )
    assert spec is not None
    assert spec.loader is not None
    unasync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(unasync)
    source = (ROOT / "src/sluicegate/client/aio.py").read_text(encoding="utf-8")
    generated = (ROOT / "src/sluicegate/client/sync.py").read_text(encoding="utf-8")
    assert unasync.unasync(source) == generated
