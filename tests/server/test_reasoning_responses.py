"""Reasoning through the Responses API, read by the official ``openai`` SDK: a
reasoning item with its ``reasoning_text`` events before the message item, and
``output_tokens_details.reasoning_tokens``."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.reasoning_splits import S28

from .test_reasoning import openai_client, scripted_app

pytestmark = pytest.mark.anyio

TOKENS = [b"<th", b"ink>pl", b"an: 2+2=4</", b"think>The", b" answer is 4."]
REQUEST: dict[str, Any] = {
    "model": "scripted",
    "input": "2+2?",
    "reasoning": {"effort": "low"},
}


def _no_id(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "id"}


async def test_a_reasoning_item_streams_before_the_message_item() -> None:
    assert b"".join(TOKENS).decode() == S28
    async with openai_client(scripted_app(TOKENS)) as client:
        stream = await client.responses.create(**REQUEST, stream=True)
        events = [event async for event in stream]
        whole = await client.responses.create(**REQUEST)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[2].item.type == "reasoning"
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == "plan: 2+2=4"
    done = [e for e in events if e.type == "response.reasoning_text.done"]
    assert [d.text for d in done] == ["plan: 2+2=4"]
    last_reasoning = max(
        i for i, k in enumerate(kinds) if k == "response.reasoning_text.delta"
    )
    first_text = kinds.index("response.output_text.delta")
    assert last_reasoning < first_text
    final = events[-1]
    assert final.type == "response.completed"
    response = final.response
    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert [c.text for c in reasoning.content or ()] == ["plan: 2+2=4"]
    assert message.type == "message"
    assert response.output_text == "The answer is 4."
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens == 4
    # stream: false gives the same items (ids are per response) and usage.
    assert [_no_id(item.model_dump()) for item in whole.output] == [
        _no_id(item.model_dump()) for item in response.output
    ]
    assert whole.usage is not None
    assert whole.usage.model_dump() == response.usage.model_dump()


async def test_a_previous_reasoning_item_in_the_input_is_accepted() -> None:
    history: list[Any] = [
        {"role": "user", "content": "1+1?"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "one and one"}],
        },
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2?"},
    ]
    async with openai_client(scripted_app(TOKENS)) as client:
        whole = await client.responses.create(
            model="scripted", input=history, reasoning={"effort": "low"}
        )
    assert [item.type for item in whole.output] == ["reasoning", "message"]


async def test_a_stored_background_response_keeps_its_reasoning_item() -> None:
    app = scripted_app(TOKENS)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        body = {**REQUEST, "background": True, "store": True}
        created = (await http.post("/v1/responses", json=body)).json()
        with anyio.fail_after(10):
            while True:
                stored = (await http.get(f"/v1/responses/{created['id']}")).json()
                if stored["status"] not in ("queued", "in_progress"):
                    break
                await anyio.sleep(0.01)
        replay = await http.get(f"/v1/responses/{created['id']}?stream=true")
    reasoning, message = stored["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "plan: 2+2=4"}]
    assert message["content"][0]["text"] == "The answer is 4."
    assert stored["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}
    deltas = [
        json.loads(line.removeprefix("data: "))
        for line in replay.text.splitlines()
        if line.startswith("data: ")
    ]
    thought = [
        d["delta"] for d in deltas if d["type"] == "response.reasoning_text.delta"
    ]
    assert "".join(thought) == "plan: 2+2=4"
