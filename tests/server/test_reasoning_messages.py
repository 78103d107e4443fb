"""Reasoning through the Messages API, read by the official ``anthropic`` SDK's
stream helper (S29): a thinking block with its signature, then the text block;
``budget_tokens`` ends the reasoning; earlier thinking blocks are accepted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx2
import pytest
from starlette.applications import Starlette

from sluicegate.core.wire.messages import thinking_signature
from sluicegate.server.apis.messages_api import to_chat_request
from sluicegate.server.schemas.anthropic_messages import parse_messages_request
from tests.reasoning_splits import S28, marker_splits

from .test_reasoning import scripted_app

pytestmark = pytest.mark.anyio

THINKING: dict[str, Any] = {"type": "enabled", "budget_tokens": 1024}
MESSAGES: list[Any] = [{"role": "user", "content": "2+2?"}]


@asynccontextmanager
async def anthropic_client(app: Starlette) -> AsyncIterator[anthropic.AsyncAnthropic]:
    # The SDK's own httpx fork, which reaches an ASGI app in process.
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport) as http:
        yield anthropic.AsyncAnthropic(
            base_url="http://t", api_key="none", http_client=http, max_retries=0
        )


def _body(**extra: Any) -> dict[str, Any]:
    return {
        "model": "scripted",
        "max_tokens": 2048,
        "thinking": THINKING,
        "messages": MESSAGES,
        **extra,
    }


async def _whole(client: anthropic.AsyncAnthropic, **extra: Any) -> Any:
    """The non-streamed answer."""
    return await client.messages.create(**_body(**extra))


async def _stream(
    client: anthropic.AsyncAnthropic, **extra: Any
) -> tuple[list[Any], Any]:
    body = _body(**extra)
    async with client.messages.stream(**body) as stream:
        events = [event async for event in stream]
        final = await stream.get_final_message()
    return events, final


def _raw(events: list[Any]) -> list[tuple[str, ...]]:
    """The raw events as (type, detail) pairs: block types, delta types."""
    out: list[tuple[str, ...]] = []
    for event in events:
        if event.type == "content_block_start":
            out.append((event.type, str(event.index), event.content_block.type))
        elif event.type == "content_block_delta":
            out.append((event.type, str(event.index), event.delta.type))
        elif event.type in {"content_block_stop", "message_start", "message_stop"}:
            out.append((event.type,))
        elif event.type == "message_delta":
            out.append((event.type, str(event.delta.stop_reason)))
    return out


def _squeezed(raw: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """``raw`` with runs of the same delta kept once."""
    return [e for i, e in enumerate(raw) if i == 0 or e != raw[i - 1]]


async def test_a_thinking_block_then_a_text_block_for_every_split() -> None:
    for tokens in marker_splits(S28):
        async with anthropic_client(scripted_app(tokens)) as client:
            events, final = await _stream(client)
            whole = await _whole(client)
        assert _squeezed(_raw(events)) == [
            ("message_start",),
            ("content_block_start", "0", "thinking"),
            ("content_block_delta", "0", "thinking_delta"),
            ("content_block_delta", "0", "signature_delta"),
            ("content_block_stop",),
            ("content_block_start", "1", "text"),
            ("content_block_delta", "1", "text_delta"),
            ("content_block_stop",),
            ("message_delta", "end_turn"),
            ("message_stop",),
        ], tokens
        signatures = [
            e
            for e in events
            if e.type == "content_block_delta" and e.delta.type == "signature_delta"
        ]
        assert len(signatures) == 1
        thinking, text = final.content
        assert thinking.type == "thinking"
        assert thinking.thinking == "plan: 2+2=4"
        assert thinking.signature == thinking_signature("plan: 2+2=4")
        assert text.type == "text"
        assert text.text == "The answer is 4."
        assert final.stop_reason == "end_turn"
        # stream: false gives the same two blocks.
        assert [b.model_dump() for b in whole.content] == [
            b.model_dump() for b in final.content
        ]
        assert whole.usage.output_tokens == final.usage.output_tokens


async def test_the_reasoning_ends_at_the_budget_and_the_text_block_follows() -> None:
    long = [b"<think>", *[b" x"] * 1100, b"</think>", b"Done."]
    async with anthropic_client(scripted_app(long)) as client:
        events, final = await _stream(client)
        whole = await _whole(client)
    thinking, text = final.content
    # The output starts inside (thinking enabled): "<think>" is dropped but
    # counted; the budget's 1024th token is the last of the reasoning.
    assert thinking.thinking == " x" * 1023
    assert text.text == " x" * 77 + "</think>Done."
    assert [b.model_dump() for b in whole.content] == [
        b.model_dump() for b in final.content
    ]
    kinds = [e.type for e in events]
    assert kinds.count("content_block_start") == 2


async def test_thinking_disabled_is_all_text() -> None:
    tokens = [b"plan", b"</think>", b"The answer"]
    async with anthropic_client(scripted_app(tokens)) as client:
        _, final = await _stream(client, thinking={"type": "disabled"})
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == "plan</think>The answer"


async def test_history_with_thinking_blocks_is_accepted() -> None:
    history: list[Any] = [
        {"role": "user", "content": "1+1?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "one and one", "signature": "abc"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "2"},
            ],
        },
        {"role": "user", "content": "2+2?"},
    ]
    async with anthropic_client(
        scripted_app([b"<think>", b"p</think>", b"4"])
    ) as client:
        _, final = await _stream(client, messages=history)
    assert [b.type for b in final.content] == ["thinking", "text"]


@pytest.mark.parametrize(
    "thinking",
    [
        {"type": "enabled"},
        {"type": "enabled", "budget_tokens": 100},
        {"type": "enabled", "budget_tokens": 4096},
    ],
)
async def test_a_bad_thinking_config_is_a_400(thinking: dict[str, Any]) -> None:
    async with anthropic_client(scripted_app([b"x"])) as client:
        with pytest.raises(anthropic.BadRequestError):
            await _whole(client, thinking=thinking)


def _turns(*messages: Any) -> list[dict[str, Any]]:
    """The chat messages a Messages body with these turns asks for."""
    body = {"model": "m", "max_tokens": 8, "messages": list(messages)}
    chat = to_chat_request(parse_messages_request(body)).chat
    return [m.model_dump(exclude_defaults=True) for m in chat.messages]


def _called(thinking: str, call_id: str) -> dict[str, Any]:
    """An assistant turn that thought, then called ``look``."""
    return {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": thinking, "signature": "s"},
            {"type": "redacted_thinking", "data": "sealed"},
            {"type": "tool_use", "id": call_id, "name": "look", "input": {}},
        ],
    }


def _answered(call_id: str, text: str = "") -> dict[str, Any]:
    """A user turn with the result of ``call_id`` (and ``text`` after it)."""
    blocks: list[Any] = [
        {"type": "tool_result", "tool_use_id": call_id, "content": "main.py"}
    ]
    return {
        "role": "user",
        "content": [*blocks, *([{"type": "text", "text": text}] if text else [])],
    }


def test_the_thinking_of_an_open_tool_use_cycle_stays_in_the_context() -> None:
    # Anthropic keeps the thinking of the turn whose calls are being answered:
    # the model goes on from it. Encrypted thinking has nothing to render.
    fix: Any = {"role": "user", "content": "Fix the bug"}
    open_cycle = _turns(fix, _called("look first", "c1"), _answered("c1"))
    assert [m.get("reasoning_content") for m in open_cycle] == [
        None,
        "look first",
        None,
    ]
    # Through several calls of one cycle, only the latest turn's thinking.
    longer = _turns(
        fix,
        _called("a", "c1"),
        _answered("c1"),
        _called("b", "c2"),
        _answered("c2", "go on"),
    )
    assert [m.get("reasoning_content") for m in longer if m["role"] == "assistant"] == [
        None,
        "b",
    ]


def test_the_thinking_of_a_closed_cycle_or_an_earlier_turn_is_left_out() -> None:
    fix: Any = {"role": "user", "content": "Fix the bug"}
    done: Any = {"role": "assistant", "content": "Fixed."}
    thanks: Any = {"role": "user", "content": "Thanks"}
    turns = [
        _turns(fix, _called("look first", "c1"), _answered("c1"), done, thanks),
        _turns(fix, _called("look first", "c1"), thanks),  # answered in words
        _turns(fix, _called("look first", "c1")),  # the last turn: nothing answers
    ]
    for messages in turns:
        assert not [m for m in messages if m.get("reasoning_content")]
