"""Deltas made of parts: joining per part and per tool-call index, chunk shapes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Finish,
    FinishReason,
    ToolCallFragment,
    Usage,
    join_parts,
)
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader, chat_delta
from sluicegate.core.wire.stream import StreamMachine
from sluicegate.server.streaming.coalesce import coalesce, join_all_deltas, join_deltas

CHAT = ResponseHeader("chatcmpl-1", 1, "m", Endpoint.CHAT)
COMPLETION = ResponseHeader("cmpl-1", 1, "m", Endpoint.COMPLETION)


def _payload(frame: bytes) -> dict[str, Any]:
    assert frame.startswith(b"data: ")
    assert frame.endswith(b"\n\n")
    payload: dict[str, Any] = json.loads(frame[6:-2])
    return payload


def test_text_only_delta_has_no_parts_and_keeps_its_chunk_shape():
    assert Delta(0, "hi").parts is None
    assert chat_delta("hi") == {"content": "hi"}
    assert chat_delta("hi", DeltaParts()) == {"content": "hi"}
    machine = StreamMachine(CHAT)
    machine.start()
    (frame,) = machine.feed(Delta(0, "hi"))
    assert _payload(frame)["choices"] == [
        {
            "index": 0,
            "delta": {"content": "hi"},
            "logprobs": None,
            "finish_reason": None,
        }
    ]


def test_chat_chunk_carries_tool_calls_in_openai_streaming_shape():
    machine = StreamMachine(CHAT)
    machine.start()
    first = DeltaParts((ToolCallFragment(0, "call_a", "get_weather", ""),))
    later = DeltaParts((ToolCallFragment(0, arguments='{"city"'),))
    (one,) = machine.feed(Delta(0, "", parts=first))
    (two,) = machine.feed(Delta(0, "", parts=later))
    assert _payload(one)["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_a",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    }
    assert _payload(two)["choices"][0]["delta"] == {
        "tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]
    }


def test_chat_chunk_carries_reasoning_as_reasoning_content_after_content():
    machine = StreamMachine(CHAT)
    machine.start()
    (frame,) = machine.feed(Delta(0, "a", parts=DeltaParts(reasoning="think")))
    assert list(_payload(frame)["choices"][0]["delta"].items()) == [
        ("content", "a"),
        ("reasoning_content", "think"),
    ]


def test_completions_chunks_carry_content_only():
    machine = StreamMachine(COMPLETION)
    machine.start()
    parts = DeltaParts((ToolCallFragment(0, "c", "f", "{}"),), "r")
    assert machine.feed(Delta(0, "", parts=parts)) == []
    (frame,) = machine.feed(Delta(0, "x", parts=parts))
    assert _payload(frame)["choices"][0]["text"] == "x"
    assert b"tool_calls" not in frame
    assert b"reasoning" not in frame


def test_empty_parts_and_empty_text_send_nothing():
    machine = StreamMachine(CHAT)
    machine.start()
    assert machine.feed(Delta(0, "", parts=DeltaParts())) == []


def test_stream_with_parts_still_ends_normally():
    machine = StreamMachine(CHAT)
    machine.start()
    machine.feed(Delta(0, "", parts=DeltaParts(reasoning="r")))
    machine.feed(Finish(0, FinishReason.STOP))
    assert machine.feed(End(Usage(1, 1)))[-1] == b"data: [DONE]\n\n"


def test_join_parts_with_none_returns_the_other_side_unchanged():
    parts = DeltaParts(reasoning="r")
    assert join_parts(None, None) is None
    assert join_parts(parts, None) is parts
    assert join_parts(None, parts) is parts


def test_tool_call_fragments_join_per_index_never_across():
    first = DeltaParts(
        (ToolCallFragment(0, "a", "f", "{"), ToolCallFragment(1, "b", "g"))
    )
    second = DeltaParts(
        (ToolCallFragment(1, arguments="["), ToolCallFragment(0, arguments="}"))
    )
    assert join_parts(first, second) == DeltaParts(
        (ToolCallFragment(0, "a", "f", "{}"), ToolCallFragment(1, "b", "g", "["))
    )


def test_join_deltas_joins_text_and_parts():
    joined = join_deltas(
        Delta(0, "a", parts=DeltaParts(reasoning="x")),
        Delta(0, "b", parts=DeltaParts(reasoning="y")),
    )
    assert joined == Delta(0, "ab", parts=DeltaParts(reasoning="xy"))
    assert join_deltas(Delta(0, "a"), Delta(0, "b")).parts is None


fragments = st.builds(
    ToolCallFragment,
    st.integers(0, 3),
    st.none() | st.text(max_size=3),
    st.none() | st.text(max_size=3),
    st.text(max_size=4),
)
parts_or_none = st.none() | st.builds(
    DeltaParts,
    st.lists(fragments, max_size=3, unique_by=lambda f: f.index).map(tuple),
    st.text(max_size=4),
)
deltas = st.lists(
    st.builds(Delta, st.just(0), st.text(max_size=4), parts=parts_or_none),
    min_size=1,
    max_size=8,
)


def _per_part(events: list[Delta]) -> tuple[str, str, dict[int, str]]:
    text = "".join(d.text for d in events)
    reasoning = "".join(d.parts.reasoning for d in events if d.parts)
    arguments: dict[int, str] = {}
    for d in events:
        for f in d.parts.tool_calls if d.parts else ():
            arguments[f.index] = arguments.get(f.index, "") + f.arguments
    return text, reasoning, arguments


def _kinds(delta: Delta) -> frozenset[str]:
    """What a delta carries: content, reasoning, tool calls (empty: nothing)."""
    parts = delta.parts or DeltaParts()
    found = {"content": bool(delta.text or delta.logprobs)}
    found |= {"reasoning": bool(parts.reasoning), "calls": bool(parts.tool_calls)}
    return frozenset(kind for kind, present in found.items() if present)


def _changes(events: list[Delta]) -> list[frozenset[str]]:
    """The kinds of ``events`` in order, each run of one kind once."""
    runs: list[frozenset[str]] = []
    for kinds in map(_kinds, events):
        if kinds and (not runs or runs[-1] != kinds):
            runs.append(kinds)
    return runs


@given(deltas)
def test_coalescing_keeps_each_parts_concatenation(events):
    coalesced, merged = coalesce(list(events))
    out = [d for d in coalesced if isinstance(d, Delta)]
    assert len(out) == len(coalesced)
    assert merged == len(events) - len(out)
    assert _per_part(out) == _per_part(events)
    for joined in out:
        if joined.parts is not None:
            indexes = [f.index for f in joined.parts.tool_calls]
            assert len(indexes) == len(set(indexes))


one_kind = st.one_of(
    st.builds(Delta, st.integers(0, 1), st.text(min_size=1, max_size=3)),
    st.builds(
        Delta,
        st.integers(0, 1),
        st.just(""),
        parts=st.builds(DeltaParts, reasoning=st.text(min_size=1, max_size=3)),
    ),
    st.builds(
        Delta,
        st.integers(0, 1),
        st.just(""),
        parts=st.builds(DeltaParts, fragments.map(lambda f: (f,))),
    ),
    st.builds(Delta, st.integers(0, 1), st.just(""), usage=st.just(Usage(1, 1))),
)


@given(st.lists(one_kind, min_size=1, max_size=12))
def test_coalescing_never_merges_across_a_change_of_kind(events):
    """Reasoning, content and tool calls pile up in any order (a client far
    behind): each joined delta carries one kind, every choice's kinds come in
    the order they were put, and each run of one kind is one delta."""
    out, _ = coalesce(list(events))
    for index in (0, 1):
        put = [d for d in events if d.index == index]
        got = [d for d in out if isinstance(d, Delta) and d.index == index]
        assert all(len(_kinds(d)) <= 1 for d in got)
        assert _changes(got) == _changes(put)
        assert len(got) == (max(len(_changes(put)), 1) if put else 0)
        assert _per_part(got) == _per_part(put)


def test_reasoning_then_content_piled_up_stay_two_deltas():
    reasoning = [Delta(0, "", parts=DeltaParts(reasoning=r)) for r in ("plan", ": 4")]
    events = [*reasoning, Delta(0, "The answer"), Delta(0, " is 4.")]
    assert coalesce(list(events)) == (
        [
            Delta(0, "", parts=DeltaParts(reasoning="plan: 4")),
            Delta(0, "The answer is 4."),
        ],
        2,
    )


@given(deltas, st.integers(0, 8))
def test_joining_is_associative_over_any_split(events, cut):
    cut = min(cut, len(events) - 1) or 1
    left, right = events[:cut], events[cut:]

    def fold(ds: list[Delta]) -> Delta:
        out = ds[0]
        for d in ds[1:]:
            out = join_deltas(out, d)
        return out

    whole = fold(events)
    split = join_deltas(fold(left), fold(right)) if right else fold(left)
    assert _per_part([whole]) == _per_part([split])


@given(deltas)
def test_tool_call_id_and_name_come_from_the_first_fragment_that_has_them(events):
    joined = join_all_deltas(list(events))
    for f in joined.parts.tool_calls if joined.parts else ():
        same = [
            g
            for d in events
            for g in (d.parts.tool_calls if d.parts else ())
            if g.index == f.index
        ]
        assert f.id == next((g.id for g in same if g.id is not None), None)
        assert f.name == next((g.name for g in same if g.name is not None), None)
