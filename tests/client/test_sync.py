from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import pytest

from sluicegate.client import Client, TimeoutKind, Timeouts
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import StreamClosed, StreamConsumed
from sluicegate.core.sse import DONE, encode_comment

from .wire import Gap, bytewise, chat_frames, error_body, good_body, transport

MESSAGES = [{"role": "user", "content": "Hi"}]


def make(
    parts: Sequence[bytes | Gap], status: int = 200, timeouts: Timeouts | None = None
) -> Client:
    return Client(transport=transport(parts, status), timeouts=timeouts)


def test_good_stream_fed_byte_by_byte_is_finished() -> None:
    with make(bytewise(good_body())) as client:
        stream = client.stream_chat(MESSAGES, model="m", max_tokens=8)
        texts = [d.text for d in stream]
        result = stream.result()
    assert "".join(texts) == "Hello wörld 🤖"
    assert len(texts) == 3  # one delta per content event, however the bytes split
    assert result.end_state is EndState.FINISHED
    assert result.status == 200
    assert result.timing.first_token_s is not None


def test_request_body_and_auth_header_are_sent() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=good_body())

    client = Client("http://h/v1", api_key="k", transport=httpx.MockTransport(handler))
    client.chat(MESSAGES, model="m", n=1, stop=["x"])
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
    client.complete("p", model="m", include_usage=False)
    assert str(seen[1].url) == "http://h/v1/completions"
    assert "stream_options" not in json.loads(seen[1].content)


@pytest.mark.parametrize(
    ("parts", "state"),
    [
        (chat_frames(["a"]), EndState.TRUNCATED),
        ([good_body()[:40]], EndState.TRUNCATED),
        ([error_body()], EndState.ERRORED),
        ([chat_frames(["a"])[0], b"data: nope\n\n", DONE], EndState.TRUNCATED),
    ],
    ids=["no-done", "cut-mid-event", "error-frame", "malformed"],
)
def test_bad_streams_end_in_their_state(parts: list[bytes], state: EndState) -> None:
    assert make(list(parts)).chat(MESSAGES, model="m").end_state is state


def test_rejected_status_carries_the_error_body() -> None:
    body = b'{"error": {"message": "bad n", "type": "invalid_request_error"}}'
    result = make([body], status=400).chat(MESSAGES, model="m")
    assert result.end_state is EndState.REJECTED
    assert result.status == 400
    assert result.error is not None
    assert result.error["message"] == "bad n"


def test_connection_cut_mid_body_is_truncated_with_the_transport_error() -> None:
    def body() -> object:
        yield chat_frames(["a"])[0]
        raise httpx.RemoteProtocolError("peer closed connection")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body())  # type: ignore[arg-type]

    result = Client(transport=httpx.MockTransport(handler)).chat(MESSAGES, model="m")
    assert result.end_state is EndState.TRUNCATED
    assert result.transport_error is not None
    assert "peer closed" in result.transport_error


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (httpx.ConnectTimeout("slow"), TimeoutKind.CONNECT),
        (httpx.ReadTimeout("no head"), TimeoutKind.FIRST_BYTE),
    ],
)
def test_timeouts_before_the_head_are_reported(
    error: Exception, kind: TimeoutKind
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise error

    result = Client(transport=httpx.MockTransport(handler)).chat(MESSAGES, model="m")
    assert result.timeout is kind
    assert result.status is None
    assert result.end_state is EndState.ABORTED


def test_connection_refused_is_truncated_without_status() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    result = Client(transport=httpx.MockTransport(handler)).chat(MESSAGES, model="m")
    assert result.end_state is EndState.TRUNCATED
    assert result.transport_error == "ConnectError: refused"


def test_idle_gap_longer_than_idle_s_times_out() -> None:
    frames = chat_frames(["a", "b"])
    parts: list[bytes | Gap] = [frames[0], frames[1], Gap(5.0), frames[2], DONE]
    result = make(parts, timeouts=Timeouts(idle_s=1.0)).chat(MESSAGES, model="m")
    assert result.timeout is TimeoutKind.IDLE
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"


def test_heartbeats_keep_an_idle_limited_stream_alive() -> None:
    frames = [*chat_frames(["a", "b"]), DONE]
    parts: list[bytes | Gap] = []
    for piece in frames:  # each silence under the limit, the sum far over it
        parts += [Gap(0.9), encode_comment(), Gap(0.9), piece]
    result = make(parts, timeouts=Timeouts(idle_s=1.0)).chat(MESSAGES, model="m")
    assert result.end_state is EndState.FINISHED
    assert result.comments == len(frames)


def test_total_limit_stops_reading() -> None:
    frames = chat_frames(["a", "b"])
    client = make([*frames, DONE], timeouts=Timeouts(total_s=0.0))
    result = client.chat(MESSAGES, model="m")
    assert result.timeout is TimeoutKind.TOTAL
    assert result.end_state is EndState.ABORTED


def test_closing_mid_stream_aborts_and_keeps_what_arrived() -> None:
    client = make(chat_frames(["a", "b", "c"]))
    with client.stream_chat(MESSAGES, model="m") as stream:
        for delta in stream:
            assert delta.text == "a"
            break
    result = stream.result()
    assert result.end_state is EndState.ABORTED
    assert result.text == "a"


def test_closing_before_iterating_sends_nothing() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, content=good_body())

    stream = Client(transport=httpx.MockTransport(handler)).stream_chat(
        MESSAGES, model="m"
    )
    stream.close()
    stream.close()
    assert calls == []
    assert stream.result().end_state is EndState.ABORTED


def test_iterating_twice_or_after_the_end_is_misuse() -> None:
    stream = make([good_body()]).stream_chat(MESSAGES, model="m")
    iter(stream)
    with pytest.raises(StreamConsumed):
        iter(stream)
    assert stream.result().end_state is EndState.FINISHED
    with pytest.raises(StreamClosed):
        iter(stream)


def test_record_keeps_raw_bytes_and_reads_past_done() -> None:
    body = good_body() + DONE
    with make([body]).stream_chat(MESSAGES, model="m", record=True) as stream:
        result = stream.result()
    assert result.raw == body
    assert result.end_state is EndState.FINISHED
