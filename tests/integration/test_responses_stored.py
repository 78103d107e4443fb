"""Stored Responses on the real model, through the official openai SDK:
background responses, ``responses.retrieve(id, stream=True, starting_after=N)``,
cancel (the engine aborts), delete, and ``previous_response_id``."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from .test_disconnect import assert_aborted
from .wire import engine_stats, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

TERMINAL = {"response.completed", "response.incomplete", "response.failed"}


def _ended(sdk: openai.OpenAI, response_id: str) -> Any:
    """Poll ``retrieve`` until the response ended (at most 60 s)."""
    deadline = time.monotonic() + 60
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status not in ("queued", "in_progress"):
            return response
        assert time.monotonic() < deadline, "the background response never ended"
        time.sleep(0.05)


def test_a_background_stream_left_early_is_resumed_from_its_sequence_number(
    sdk: openai.OpenAI, model_id: str
) -> None:
    stream = sdk.responses.create(
        model=model_id,
        input="Count from one to ten.",
        max_output_tokens=24,
        background=True,
        stream=True,
    )
    seen: list[Any] = []
    for event in stream:
        seen.append(event)
        if event.type == "response.output_text.delta":
            break
    stream.close()  # a background response keeps running without its reader
    response_id = seen[0].response.id
    rest: list[Any] = list(
        sdk.responses.retrieve(
            response_id, stream=True, starting_after=seen[-1].sequence_number
        )
    )
    events = seen + rest
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events if e.type in TERMINAL] == [events[-1].type]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = _ended(sdk, response_id)
    assert final.output_text == text == events[-1].response.output_text
    assert final.usage.output_tokens == events[-1].response.usage.output_tokens
    again: list[Any] = list(
        sdk.responses.retrieve(response_id, stream=True, starting_after=2)
    )
    assert [e.model_dump() for e in again] == [e.model_dump() for e in events[3:]]


def test_cancel_aborts_a_background_response_and_delete_forgets_it(
    sdk: openai.OpenAI, http: httpx.Client, model_id: str
) -> None:
    before = engine_stats(http)
    created = sdk.responses.create(
        model=model_id,
        input="Write a long story about a lighthouse.",
        max_output_tokens=1024,
        background=True,
    )
    assert (created.status, created.background) == ("in_progress", True)
    request_id = f"{created.id}-0"
    stats, _ = wait_until(
        http,
        lambda s: request_id in s["running_ids"],
        started_s=time.monotonic(),
        give_up_s=30,
        interval_s=0.01,
    )
    assert stats is not None, "the background response never ran"
    cancelled_at_s = time.monotonic()
    cancelled = sdk.responses.cancel(created.id)
    assert cancelled.status == "cancelled"
    assert_aborted(http, request_id, cancelled_at_s, before)
    assert sdk.responses.retrieve(created.id).status == "cancelled"
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(created.id)


def test_previous_response_id_carries_the_conversation(
    sdk: openai.OpenAI, model_id: str
) -> None:
    first: Any = sdk.responses.create(
        model=model_id, input="My name is Ada.", max_output_tokens=8, store=True
    )
    second: Any = sdk.responses.create(
        model=model_id,
        input="What is my name?",
        max_output_tokens=8,
        previous_response_id=first.id,
    )
    assert second.status in ("completed", "incomplete")
    alone: Any = sdk.responses.create(
        model=model_id, input="What is my name?", max_output_tokens=8
    )
    carried = first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens >= alone.usage.input_tokens + carried - 2
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(
            model=model_id,
            input="x",
            max_output_tokens=4,
            previous_response_id=alone.id,
        )
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]
