"""``MessagesStream`` and the Messages bodies: Anthropic's events from the core's.

Unit tests pin each event's shape; the property test feeds any legal sequence
of text and tool-call deltas and checks that the frames are a well-formed
Messages stream whose blocks carry exactly the text and arguments fed.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Fail,
    Finish,
    FinishReason,
    Heartbeat,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.contracts import Whole, error_body, stream_machine, whole_body
from sluicegate.core.wire.messages import (
    MessagesStream,
    message_body,
    message_error_body,
    stop_reason,
    thinking_signature,
    usage_object,
)
from sluicegate.core.wire.sse import SSEDecoder
from sluicegate.core.wire.stream import StreamMachine

from .strategies import tricky_text

HEADER = ResponseHeader(
    "msg_1", 0, "gemma", Endpoint.MESSAGES, prompt_tokens=7, include_usage=True
)
USAGE = Usage(7, 3)


def events(frames: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of each frame, decoded by the strict SSE decoder;
    the name always equals the data's ``type``."""
    decoder = SSEDecoder()
    out = []
    for event in decoder.feed(b"".join(frames)) + decoder.flush():
        data = json.loads(event.data)
        assert event.event == data["type"]
        out.append((event.event, data))
    return out


def outcome(machine: Any) -> EndState:
    """``machine.outcome`` now (a call, so that type checkers do not narrow it)."""
    return machine.outcome  # type: ignore[no-any-return]


def ended(machine: Any) -> EndState | None:
    """``machine.end_state`` now."""
    return machine.end_state  # type: ignore[no-any-return]


def call(index: int, arguments: str, *, head: bool = False) -> Delta:
    fragment = ToolCallFragment(
        index, f"call_{index}" if head else None, "f" if head else None, arguments
    )
    return Delta(0, "", parts=DeltaParts((fragment,)))


def run(*fed: Any) -> list[tuple[str, dict[str, Any]]]:
    machine = MessagesStream(HEADER)
    frames = machine.start()
    for event in fed:
        frames += machine.feed(event)
    return events(frames)


def test_text_then_a_call_gives_two_blocks_and_the_tool_use_ending() -> None:
    got = run(
        Delta(0, "Hi"),
        Delta(0, " there"),
        call(0, '{"a"', head=True),
        call(0, ": 1}"),
        Finish(0, FinishReason.TOOL_CALLS),
        End(USAGE),
    )
    names = [name for name, _ in got]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = got[0][1]["message"]
    assert start["id"] == "msg_1"
    assert start["usage"] == {
        "input_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
    }
    assert got[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert got[5][1]["index"] == 1
    assert got[5][1]["content_block"] == {
        "type": "tool_use",
        "id": "call_0",
        "name": "f",
        "input": {},
    }
    assert got[6][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    assert got[9][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 3,
        },
    }


def test_a_stop_string_is_named_and_text_after_a_call_opens_a_new_block() -> None:
    got = run(
        call(0, "{}", head=True),
        Delta(0, "ok"),
        Finish(0, FinishReason.STOP, stop_sequence="."),
        End(USAGE),
    )
    starts = [data["content_block"]["type"] for n, data in got if "block_start" in n]
    assert starts == ["tool_use", "text"]
    assert got[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "."}


def test_heartbeats_are_pings_and_a_fail_is_one_error_event() -> None:
    machine = MessagesStream(HEADER)
    frames = machine.start() + machine.feed(Heartbeat()) + machine.feed(Delta(0, "x"))
    frames += machine.feed(Fail("engine down", code="engine_unavailable"))
    got = events(frames)
    assert got[1] == ("ping", {"type": "ping"})
    assert got[-1] == (
        "error",
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "engine down"},
        },
    )
    assert ended(machine) is EndState.ERRORED
    assert outcome(machine) is EndState.TRUNCATED  # not reported written yet
    machine.wrote()
    assert outcome(machine) is EndState.ERRORED
    with pytest.raises(LocalProtocolError):
        machine.feed(Delta(0, "more"))
    other = MessagesStream(HEADER)
    other.start()
    assert events(other.feed(Fail("boom")))[0][1]["error"]["type"] == "api_error"


def test_outcome_follows_the_write_reports() -> None:
    machine = MessagesStream(HEADER)
    assert machine.header is HEADER
    assert machine.state.name == "NEW"
    assert ended(machine) is None
    machine.start()
    machine.feed(Delta(0, "a"))
    machine.feed(Finish(0, FinishReason.LENGTH))
    assert machine.finish_reasons == (FinishReason.LENGTH,)
    machine.feed(End(USAGE))
    assert ended(machine) is EndState.FINISHED
    machine.write_failed()
    assert outcome(machine) is EndState.ABORTED
    with pytest.raises(LocalProtocolError):
        machine.wrote()
    done = MessagesStream(HEADER)
    done.start()
    done.feed(Finish(0, FinishReason.STOP))
    frames = done.feed(End(USAGE))
    done.wrote()
    assert outcome(done) is EndState.FINISHED
    assert events(frames)[0][1]["delta"]["stop_reason"] == "end_turn"


def test_illegal_events_raise_and_change_nothing() -> None:
    machine = MessagesStream(HEADER)
    with pytest.raises(LocalProtocolError, match="not allowed in state NEW"):
        machine.feed(Delta(0, "early"))
    machine.start()
    with pytest.raises(LocalProtocolError, match="one output"):
        machine.feed(Delta(1, "x"))
    with pytest.raises(LocalProtocolError):
        machine.feed(End(USAGE))
    assert machine.state.name == "STREAMING"
    with pytest.raises(ValueError, match="one output"):
        MessagesStream(ResponseHeader("m", 0, "g", Endpoint.MESSAGES, n=2))


def test_the_whole_message_body() -> None:
    calls = (
        ToolCallFragment(0, "call_0", "f", '{"x": [1]}'),
        ToolCallFragment(1, "call_1", "g", ""),
        ToolCallFragment(2, None, None, "{cut"),
    )
    body = whole_body(HEADER, Whole("text", FinishReason.TOOL_CALLS, USAGE, calls))
    assert body["content"] == [
        {"type": "text", "text": "text"},
        {"type": "tool_use", "id": "call_0", "name": "f", "input": {"x": [1]}},
        {"type": "tool_use", "id": "call_1", "name": "g", "input": {}},
        {"type": "tool_use", "id": "", "name": "", "input": {}},
    ]
    assert body["stop_reason"] == "tool_use"
    assert body["usage"] == {
        "input_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 3,
    }
    cut = message_body(HEADER, Whole("", None, USAGE))
    assert cut["content"] == []
    assert cut["stop_reason"] is None


def test_error_bodies_in_each_api_shape() -> None:
    assert message_error_body(404, "no")["error"] == {
        "type": "not_found_error",
        "message": "no",
    }
    assert message_error_body(418, "x")["error"]["type"] == "invalid_request_error"
    assert message_error_body(502, "x")["error"]["type"] == "api_error"
    assert error_body(Endpoint.MESSAGES, 429, "slow")["error"]["type"] == (
        "rate_limit_error"
    )
    assert error_body(Endpoint.CHAT, 400, "bad", "invalid_request_error", "n") == {
        "error": {
            "message": "bad",
            "type": "invalid_request_error",
            "param": "n",
            "code": None,
        }
    }
    assert stop_reason(None, None) is None
    assert stop_reason(FinishReason.CONTENT_FILTER, None) == "refusal"


def test_the_machine_and_body_follow_the_endpoint() -> None:
    assert isinstance(stream_machine(HEADER), MessagesStream)
    chat = ResponseHeader("c", 0, "g", Endpoint.CHAT)
    assert isinstance(stream_machine(chat), StreamMachine)
    with pytest.raises(ValueError, match="no whole body"):
        whole_body(chat, Whole("", None, USAGE))


# One step of a stream: text, or a piece of the current call, or a new call.
_steps = st.lists(
    st.one_of(
        tricky_text.map(lambda text: ("text", text)),
        st.text(max_size=6).map(lambda piece: ("args", piece)),
        st.text(max_size=6).map(lambda piece: ("call", piece)),
    ),
    max_size=12,
)


@given(_steps, st.sampled_from(list(FinishReason)))
def test_any_legal_sequence_gives_well_formed_blocks(
    steps: list[tuple[str, str]], reason: FinishReason
) -> None:
    fed: list[Any] = []
    texts: list[str] = []
    calls: list[str] = []
    last = ""
    for kind, value in steps:
        if kind == "text":
            fed.append(Delta(0, value))
            texts.append(value)
        elif kind == "call" or not calls or last == "text":
            # Content text between calls ends the call before it (as the
            # tool-call parser gives them): later arguments are a new call's.
            fed.append(call(len(calls), value, head=True))
            calls.append(value)
        else:
            fed.append(call(len(calls) - 1, value))
            calls[-1] += value
        last = kind
    got = run(*fed, Finish(0, reason), End(USAGE))
    open_block: int | None = None
    text_seen, args_seen = "", []
    next_index = 0
    for name, data in got[1:-2]:
        if name == "content_block_start":
            assert open_block is None
            assert data["index"] == next_index
            open_block, next_index = data["index"], next_index + 1
            if data["content_block"]["type"] == "tool_use":
                args_seen.append("")
        elif name == "content_block_delta":
            assert data["index"] == open_block
            delta = data["delta"]
            if delta["type"] == "text_delta":
                assert delta["text"]
                text_seen += delta["text"]
            else:
                args_seen[-1] += delta["partial_json"]
        else:
            assert name == "content_block_stop"
            assert data["index"] == open_block
            open_block = None
    assert open_block is None
    assert text_seen == "".join(texts)
    assert args_seen == calls
    assert [name for name, _ in got[-2:]] == ["message_delta", "message_stop"]


def test_usage_splits_the_prompt_into_uncached_and_cache_read_tokens() -> None:
    assert usage_object(Usage(10, 4, cached_tokens=6)) == {
        "input_tokens": 4,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 6,
        "output_tokens": 4,
    }
    assert usage_object(Usage(3, 1, cached_tokens=9))["input_tokens"] == 0


def thought(text: str) -> Delta:
    return Delta(0, "", parts=DeltaParts(reasoning=text))


def test_reasoning_is_a_thinking_block_signed_once_before_the_text() -> None:
    got = run(
        thought("plan"),
        thought(": 4"),
        Delta(0, "Four."),
        Finish(0, FinishReason.STOP),
        End(USAGE),
    )
    assert [(name, data.get("index")) for name, data in got[:7]] == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
    ]
    assert got[1][1]["content_block"] == {
        "type": "thinking",
        "thinking": "",
        "signature": "",
    }
    assert got[3][1]["delta"] == {"type": "thinking_delta", "thinking": ": 4"}
    signature = thinking_signature("plan: 4")
    assert got[4][1]["delta"] == {"type": "signature_delta", "signature": signature}
    whole = Whole("Four.", FinishReason.STOP, USAGE, reasoning="plan: 4")
    assert whole_body(HEADER, whole)["content"] == [
        {"type": "thinking", "thinking": "plan: 4", "signature": signature},
        {"type": "text", "text": "Four."},
    ]


def test_a_stream_cut_inside_the_reasoning_still_signs_and_closes_it() -> None:
    got = run(thought("pl"), Finish(0, FinishReason.LENGTH), End(USAGE))
    names = [(name, data.get("delta", {}).get("type")) for name, data in got]
    assert names[2:5] == [
        ("content_block_delta", "thinking_delta"),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
