"""``ResponsesStream`` and the Responses bodies: typed events from the core's.

Unit tests pin each event's shape; the property test feeds any legal sequence
of text and tool-call deltas and checks that sequence numbers count by one,
items open and close in order, and they carry exactly the text and arguments
fed.
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
    CANCELLED,
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
from sluicegate.core.wire.contracts import Whole, stream_machine, whole_body
from sluicegate.core.wire.responses import ResponsesStream, response_body
from sluicegate.core.wire.sse import SSEDecoder

from .strategies import tricky_text

HEADER = ResponseHeader("resp_1", 5, "gemma", Endpoint.RESPONSES)
USAGE = Usage(7, 3)


def events(frames: list[bytes]) -> list[dict[str, Any]]:
    """Each frame's data; its event name equals its ``type``; comments dropped."""
    decoder = SSEDecoder()
    out = []
    for event in decoder.feed(b"".join(frames)) + decoder.flush():
        data = json.loads(event.data)
        assert event.event == data["type"]
        out.append(data)
    return out


def outcome(machine: Any) -> EndState:
    """``machine.outcome`` now (a call, so that type checkers do not narrow it)."""
    return machine.outcome  # type: ignore[no-any-return]


def snapshot(machine: Any) -> dict[str, Any] | None:
    """``machine.snapshot`` now."""
    return machine.snapshot  # type: ignore[no-any-return]


def ended(machine: Any) -> EndState | None:
    """``machine.end_state`` now."""
    return machine.end_state  # type: ignore[no-any-return]


def call(index: int, arguments: str, *, head: bool = False) -> Delta:
    fragment = ToolCallFragment(
        index, f"call_{index}" if head else None, "f" if head else None, arguments
    )
    return Delta(0, "", parts=DeltaParts((fragment,)))


def run(*fed: Any) -> list[dict[str, Any]]:
    machine = ResponsesStream(HEADER)
    frames = machine.start()
    for event in fed:
        frames += machine.feed(event)
    return events(frames)


def test_text_then_a_call_then_completed() -> None:
    got = run(
        Delta(0, "Hi"),
        call(0, '{"a"', head=True),
        call(0, ": 1}"),
        Finish(0, FinishReason.TOOL_CALLS),
        End(USAGE),
    )
    assert [e["type"] for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    assert got[0]["response"]["status"] == "in_progress"
    assert got[0]["response"]["output"] == []
    assert got[5]["text"] == "Hi"
    assert got[8]["item"] == {
        "id": "fc_0",
        "type": "function_call",
        "status": "in_progress",
        "call_id": "call_0",
        "name": "f",
        "arguments": "",
    }
    assert got[11]["arguments"] == '{"a": 1}'
    final = got[-1]["response"]
    assert final["status"] == "completed"
    assert final["usage"]["total_tokens"] == 10
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Hi"


def test_the_length_limit_is_incomplete_and_a_fail_is_response_failed() -> None:
    got = run(Delta(0, "a"), Finish(0, FinishReason.LENGTH), End(USAGE))
    last = got[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["status"] == "incomplete"
    machine = ResponsesStream(HEADER)
    frames = machine.start() + machine.feed(Heartbeat()) + machine.feed(Delta(0, "x"))
    assert frames[2] == b": keep-alive\n\n"
    frames += machine.feed(Fail("engine down", code="engine_unavailable"))
    failed = events(frames)[-1]
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"] == {
        "code": "engine_unavailable",
        "message": "engine down",
    }
    assert failed["response"]["output"][0]["status"] == "incomplete"  # cut off
    assert ended(machine) is EndState.ERRORED
    machine.wrote()
    assert outcome(machine) is EndState.ERRORED
    with pytest.raises(LocalProtocolError):
        machine.feed(Delta(0, "more"))
    other = ResponsesStream(HEADER)
    other.start()
    assert events(other.feed(Fail("x")))[0]["response"]["error"]["code"] == (
        "server_error"
    )


def test_the_snapshot_is_the_last_response_and_a_cancel_is_cancelled() -> None:
    machine = ResponsesStream(HEADER)
    assert snapshot(machine) is None
    first = events(machine.start())[0]["response"]
    assert snapshot(machine) == first
    frames = machine.feed(Delta(0, "par")) + machine.feed(Fail("stop", code=CANCELLED))
    cancelled = events(frames)[-1]
    assert cancelled["type"] == "response.failed"  # no event of its own
    assert cancelled["response"]["status"] == "cancelled"
    assert snapshot(machine) == cancelled["response"]
    assert cancelled["response"]["output"][0]["content"][0]["text"] == "par"
    done = ResponsesStream(HEADER)
    done.start()
    done.feed(Delta(0, "ok"))
    terminal = events(done.feed(Finish(0, FinishReason.STOP)) + done.feed(End(USAGE)))
    assert done.snapshot == terminal[-1]["response"]
    assert terminal[-1]["response"]["status"] == "completed"


def test_outcome_and_illegal_events() -> None:
    machine = ResponsesStream(HEADER)
    assert machine.header is HEADER
    assert ended(machine) is None
    with pytest.raises(LocalProtocolError, match="not allowed in state NEW"):
        machine.feed(Delta(0, "early"))
    machine.start()
    with pytest.raises(LocalProtocolError, match="one output"):
        machine.feed(Delta(1, "x"))
    machine.feed(Finish(0, FinishReason.STOP))
    assert machine.finish_reasons == (FinishReason.STOP,)
    machine.feed(End(USAGE))
    assert machine.state.name == "FINISHED"
    assert ended(machine) is EndState.FINISHED
    machine.wrote()
    assert outcome(machine) is EndState.FINISHED
    machine.write_failed()
    with pytest.raises(LocalProtocolError):
        machine.wrote()
    gone = ResponsesStream(HEADER)
    gone.start()
    gone.write_failed()
    assert outcome(gone) is EndState.ABORTED
    with pytest.raises(ValueError, match="one output"):
        ResponsesStream(ResponseHeader("r", 0, "g", Endpoint.RESPONSES, n=2))


def test_a_content_filter_is_incomplete_with_its_reason() -> None:
    got = run(Delta(0, "a"), Finish(0, FinishReason.CONTENT_FILTER), End(USAGE))
    assert got[-1]["type"] == "response.incomplete"
    assert got[-1]["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert got[-1]["response"]["output"][0]["status"] == "incomplete"
    body = response_body(HEADER, Whole("a", FinishReason.CONTENT_FILTER, USAGE))
    assert (body["status"], body["incomplete_details"]) == (
        "incomplete",
        {"reason": "content_filter"},
    )


def test_the_whole_response_body() -> None:
    calls = (ToolCallFragment(0, "call_x", "f", "{}"),)
    body = whole_body(HEADER, Whole("hi", FinishReason.TOOL_CALLS, USAGE, calls))
    assert body["object"] == "response"
    assert body["status"] == "completed"
    assert [item["status"] for item in body["output"]] == ["completed", "completed"]
    assert body["output"][1]["call_id"] == "call_x"
    assert body["output"][1]["arguments"] == "{}"
    cut = response_body(HEADER, Whole("a", FinishReason.LENGTH, USAGE))
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    empty = response_body(HEADER, Whole("", None, USAGE))
    assert empty["output"] == []
    assert isinstance(stream_machine(HEADER), ResponsesStream)


_steps = st.lists(
    st.one_of(
        tricky_text.map(lambda text: ("text", text)),
        st.text(max_size=6).map(lambda piece: ("args", piece)),
        st.text(max_size=6).map(lambda piece: ("call", piece)),
    ),
    max_size=12,
)


@given(_steps, st.sampled_from(list(FinishReason)))
def test_any_legal_sequence_gives_well_formed_items(
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
            fed.append(call(len(calls), value, head=True))
            calls.append(value)
        else:
            fed.append(call(len(calls) - 1, value))
            calls[-1] += value
        last = kind
    got = run(*fed, Finish(0, reason), End(USAGE))
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    terminal = [
        e for e in got if e["type"] in ("response.completed", "response.incomplete")
    ]
    assert terminal == [got[-1]]
    output = got[-1]["response"]["output"]
    text = "".join(
        item["content"][0]["text"] for item in output if item["type"] == "message"
    )
    assert text == "".join(texts)
    assert [i["arguments"] for i in output if i["type"] == "function_call"] == calls
    added = [
        e["output_index"] for e in got if e["type"] == "response.output_item.added"
    ]
    done = [e["output_index"] for e in got if e["type"] == "response.output_item.done"]
    assert added == done == list(range(len(output)))


def test_reasoning_is_an_item_of_its_own_before_the_message() -> None:
    thought = Delta(0, "", parts=DeltaParts(reasoning="plan"))
    got = run(
        thought,
        Delta(0, "", parts=DeltaParts(reasoning="!")),
        Delta(0, "Four."),
        Finish(0, FinishReason.LENGTH),
        End(Usage(7, 3, reasoning_tokens=2)),
    )
    kinds = [e["type"] for e in got]
    assert kinds[2:10] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert got[3]["part"] == {"type": "reasoning_text", "text": ""}
    assert got[4]["delta"] == "plan"
    final = got[-1]["response"]
    assert final["status"] == "incomplete"
    item = final["output"][0]
    assert item["type"] == "reasoning"
    assert item["content"] == [{"type": "reasoning_text", "text": "plan!"}]
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}
    whole = Whole(
        "Four.", FinishReason.LENGTH, Usage(7, 3, reasoning_tokens=2), reasoning="plan!"
    )
    assert response_body(HEADER, whole)["output"] == final["output"]


def test_reasoning_and_text_inside_a_call_come_after_its_item() -> None:
    got = run(
        call(0, '{"a"', head=True),
        Delta(0, "", parts=DeltaParts(reasoning="hm")),
        Delta(0, "Hi"),
        call(0, ": 1}"),
        Finish(0, FinishReason.LENGTH),
        End(USAGE),
    )
    assert [e["sequence_number"] for e in got] == list(range(len(got)))
    output = got[-1]["response"]["output"]
    assert [(i["type"], i["status"]) for i in output] == [
        ("function_call", "completed"),
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    assert output[0]["name"] == "f"
    assert output[0]["arguments"] == '{"a": 1}'
    assert output[1]["content"][0]["text"] == "hm"
    assert output[2]["content"][0]["text"] == "Hi"
    added = [
        e["output_index"] for e in got if e["type"] == "response.output_item.added"
    ]
    done = [e["output_index"] for e in got if e["type"] == "response.output_item.done"]
    assert added == done == [0, 1, 2]
