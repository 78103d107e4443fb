"""An engine failure after the first byte is reported in band.

The fault is injected with the scripted engine (``--fault error-after:3``: the
sequence fails after three decode steps), so these tests need no model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from .servers import ServerProcess, StartServer
from .wire import DONE, engine_stats, record_stream, wait_until

pytestmark = [pytest.mark.integration]

CHAT = "/v1/chat/completions"
STORY = {
    "model": "default",
    "messages": [{"role": "user", "content": "Tell me a long story."}],
    "max_tokens": 512,
}


@pytest.fixture(scope="module")
def faulty_server(start_server: StartServer) -> ServerProcess:
    return start_server(
        "scripted-fault", "--engine", "scripted", "--fault", "error-after:3"
    )


@pytest.fixture
def faulty_http(faulty_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=faulty_server.base_url, timeout=30) as client:
        yield client


def test_failure_mid_stream_is_one_error_event_and_no_done(
    faulty_http: httpx.Client,
) -> None:
    """Content, then exactly one error event, then the stream closes."""
    before = engine_stats(faulty_http)
    recorded = record_stream(faulty_http, CHAT, {**STORY, "stream": True})

    assert recorded.status == 200
    assert recorded.tail == "", f"stream cut mid-event: {recorded.tail!r}"
    assert DONE not in recorded.events, recorded.events
    payloads: list[dict[str, Any]] = [json.loads(e) for e in recorded.events]
    errors = [p for p in payloads if "error" in p]
    assert len(errors) == 1, payloads
    assert payloads[-1] is errors[0], "events followed the error event"
    error = errors[0]["error"]
    assert isinstance(error["message"], str), error
    assert error["message"].strip(), error

    chunks = payloads[:-1]
    content = [
        c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")
    ]
    assert content, "the fault was meant to come after the first content chunk"
    reasons = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert reasons == [None] * len(reasons), "a finish chunk before the error"

    after, _ = wait_until(
        faulty_http,
        lambda s: s["failed_requests"] == before["failed_requests"] + 1,
        started_s=recorded.sent_at_s,
        give_up_s=5.0,
    )
    assert after is not None, engine_stats(faulty_http)
    assert after["generated_tokens"] > before["generated_tokens"]
    assert after["running"] == 0
    assert after["kv_cells_used"] == 0


def test_sdk_raises_api_error_on_an_in_band_error(faulty_server: ServerProcess) -> None:
    """Seen through the official client: iterating raises ``APIError``."""
    received: list[Any] = []
    with openai.OpenAI(
        base_url=f"{faulty_server.base_url}/v1", api_key="x", max_retries=0
    ) as client:
        stream = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Tell me a long story."}],
            max_tokens=512,
            stream=True,
        )
        with pytest.raises(openai.APIError) as caught:
            received.extend(stream)

    assert not isinstance(caught.value, openai.APIConnectionError), caught.value
    assert caught.value.message.strip()
    assert any(c.choices and c.choices[0].delta.content for c in received), received
