"""Both clients resume a resumable stream after its connection dropped."""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import pytest

from sluicegate.client import Resumption
from sluicegate.core.endstate import EndState
from sluicegate.core.wire.sse import DONE

from .drivers import Driver, driver
from .wire import SSE_HEADERS, Cut, Part, _async_body, _sync_body, chat_frames

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": "hi"}]
NOW = Resumption(max_resumes=3, backoff_s=0.0)


def with_ids(frames: Sequence[bytes], response_id: str = "chatcmpl-1") -> list[bytes]:
    return [
        b"id: %s.%d\n%s" % (response_id.encode(), i, f) for i, f in enumerate(frames)
    ]


FRAMES = with_ids([*chat_frames(["a", "b", "c"]), DONE])


def answering(
    kind: str, bodies: list[tuple[int, list[Part]]], seen: list[httpx.Request]
) -> Driver:
    """A client whose n-th request gets the n-th ``(status, parts)``."""

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, parts = bodies[min(len(seen), len(bodies)) - 1]
        body = _async_body if kind == "async" else _sync_body
        return httpx.Response(status, headers=SSE_HEADERS, content=body(parts, request))

    return driver(kind, transport=httpx.MockTransport(handler), resumption=NOW)


async def test_a_stream_cut_mid_event_resumes_from_the_last_whole_event(
    client_kind: str,
) -> None:
    cut_at = len(FRAMES[0]) + len(FRAMES[1]) + 5  # inside frame 2 ("b")
    whole = b"".join(FRAMES)
    seen: list[httpx.Request] = []
    bodies: list[tuple[int, list[Part]]] = [
        (200, [whole[:cut_at], Cut()]),
        (200, list(FRAMES[2:])),
    ]
    async with answering(client_kind, bodies, seen) as client:
        stream = client.stream_chat(MESSAGES, model="m", resumable=True)
        texts = await stream.texts()
        result = await stream.result()
    assert texts == ["a", "b", "c"]
    assert result.end_state is EndState.FINISHED
    assert result.resumes == 1
    assert result.transport_error is None
    assert json.loads(seen[0].content)["stream_options"] == {
        "include_usage": True,
        "resumable": True,
    }
    assert seen[1].method == "GET"
    assert seen[1].url.path == "/v1/chat/completions/chatcmpl-1/events"
    assert seen[1].headers["last-event-id"] == "chatcmpl-1.1"


async def test_a_resume_that_is_refused_leaves_the_stream_truncated(
    client_kind: str,
) -> None:
    seen: list[httpx.Request] = []
    bodies: list[tuple[int, list[Part]]] = [
        (200, [*FRAMES[:2], Cut()]),
        (404, [b'{"error": {"message": "gone"}}']),
    ]
    async with answering(client_kind, bodies, seen) as client:
        result = await client.chat(MESSAGES, model="m")
    assert result.end_state is EndState.TRUNCATED
    assert result.resumes == 1
    assert result.choices[0].text == "a"


async def test_resumes_are_bounded(client_kind: str) -> None:
    seen: list[httpx.Request] = []
    bodies: list[tuple[int, list[Part]]] = [(200, [*FRAMES[:2], Cut()])]
    async with answering(client_kind, bodies, seen) as client:
        result = await client.chat(MESSAGES, model="m")
    assert len(seen) == 1 + NOW.max_resumes
    assert result.resumes == NOW.max_resumes
    assert result.end_state is EndState.TRUNCATED
    assert result.transport_error is not None


async def test_a_stream_without_ids_is_not_resumed(client_kind: str) -> None:
    seen: list[httpx.Request] = []
    bodies: list[tuple[int, list[Part]]] = [(200, [*chat_frames(["a"])[:2], Cut()])]
    async with answering(client_kind, bodies, seen) as client:
        result = await client.chat(MESSAGES, model="m")
    assert len(seen) == 1
    assert result.resumes == 0
    assert result.end_state is EndState.TRUNCATED


async def test_a_completion_resumes_on_its_own_path(client_kind: str) -> None:
    seen: list[httpx.Request] = []
    frames = with_ids([*chat_frames(["a"]), DONE], "cmpl-9")
    bodies: list[tuple[int, list[Part]]] = [
        (200, [*frames[:2], Cut()]),
        (200, list[Part](frames[2:])),
    ]
    async with answering(client_kind, bodies, seen) as client:
        result = await client.complete("p", model="m")
    assert result.resumes == 1
    assert seen[1].url.path == "/v1/completions/cmpl-9/events"


def test_backoff_doubles_up_to_its_bound() -> None:
    resumption = Resumption(backoff_s=0.1, max_backoff_s=0.3)
    assert [resumption.delay_s(i) for i in range(4)] == [0.1, 0.2, 0.3, 0.3]
