"""Responses input items as the chat messages the template renders: the
reasoning of an open function-call cycle is kept as the calling turn's
``reasoning_content``; reasoning of closed turns is not."""

from __future__ import annotations

from typing import Any

import pytest

from sluicegate.core.errors import RequestError
from sluicegate.server.apis.responses_api import (
    parse_responses_request,
    to_chat_request,
)

ASK: dict[str, Any] = {"role": "user", "content": "What is in the repo?"}


def _chat(*items: Any, history: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    """The chat messages a Responses body with these input items asks for."""
    request = parse_responses_request({"model": "m", "input": list(items)})
    chat = to_chat_request(request, history=history).chat
    return [m.model_dump(exclude_defaults=True) for m in chat.messages]


def _thought(text: str, summary: str = "") -> dict[str, Any]:
    """A reasoning item as this server writes it (its text in ``content``),
    or with only a summary, as OpenAI writes it."""
    item: dict[str, Any] = {"type": "reasoning", "id": "rs_" + text, "summary": []}
    if text:
        item["content"] = [{"type": "reasoning_text", "text": text}]
    if summary:
        item["summary"] = [{"type": "summary_text", "text": summary}]
    return item


def _call(call_id: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "ls",
        "arguments": "{}",
    }


def _output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "a.py"}


def _reasoning(messages: list[dict[str, Any]]) -> list[Any]:
    return [m.get("reasoning_content") for m in messages]


def test_the_reasoning_before_the_calls_being_answered_reaches_the_template() -> None:
    messages = _chat(ASK, _thought("list it"), _call("c1"), _call("c2"), _output("c1"))
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert _reasoning(messages) == [None, "list it", None]
    assert len(messages[1]["tool_calls"]) == 2


def test_a_summary_is_the_text_when_the_item_has_no_reasoning_text() -> None:
    messages = _chat(
        ASK, _thought("", summary="look around"), _call("c1"), _output("c1")
    )
    assert _reasoning(messages) == [None, "look around", None]
    # Content and summary both: the content, which is the model's own text.
    both = _chat(ASK, _thought("ls", summary="look"), _call("c1"), _output("c1"))
    assert _reasoning(both)[1] == "ls"
    # Only encrypted content: nothing to render.
    sealed = {
        "type": "reasoning",
        "id": "rs_x",
        "summary": [],
        "encrypted_content": "x",
    }
    assert _reasoning(_chat(ASK, sealed, _call("c1"), _output("c1")))[1] is None


def test_only_the_latest_call_of_a_cycle_keeps_its_reasoning() -> None:
    messages = _chat(
        ASK,
        _thought("first"),
        _call("c1"),
        _output("c1"),
        _thought("second"),
        _call("c2"),
        _output("c2"),
    )
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert _reasoning(assistant) == [None, "second"]


def test_the_cycle_may_begin_in_the_previous_response() -> None:
    # previous_response_id: the reasoning and the call are the stored output,
    # the input only answers the call.
    history = (ASK, _thought("list it"), _call("c1"))
    messages = _chat(_output("c1"), history=history)
    assert _reasoning(messages) == [None, "list it", None]


def test_the_reasoning_of_a_closed_turn_is_left_out() -> None:
    done = {"role": "assistant", "content": "Only a.py."}
    thanks = {"role": "user", "content": "Thanks"}
    for items in [
        (ASK, _thought("list it"), _call("c1"), _output("c1"), done, thanks),
        (ASK, _thought("list it"), _call("c1"), _output("c1"), thanks),
        (ASK, _thought("list it"), _call("c1")),  # nothing answers it yet
        (ASK, _thought("list it"), done, thanks),  # no call at all
    ]:
        assert not [m for m in _chat(*items) if m.get("reasoning_content")], items


def test_arguments_and_text_of_another_type_are_a_400_naming_them() -> None:
    """A call's arguments as an object reached the chat checks (a 400 naming
    messages[0].tool_calls[0].function.arguments); a part's text as an object
    became its repr in the prompt."""
    call = {**_call("c1"), "arguments": {"path": "."}}
    part = {"type": "input_text", "text": {"a": 1}}
    bad = [
        ((call, _output("c1")), "input[0].arguments"),
        (({"role": "user", "content": [part]},), "input[0].content[0].text"),
    ]
    for items, param in bad:
        with pytest.raises(RequestError) as caught:
            _chat(*items)
        assert caught.value.param == param
        assert "expected a string, got dict" in str(caught.value)
