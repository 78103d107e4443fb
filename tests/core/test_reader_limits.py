"""The upstream reader's bounds, its tool-name check and its usage check.

A hostile upstream's body, in any split: ``UpstreamReader`` raises nothing but
its own misuse error, holds no more than its bounds between two ``feed``
calls, and ends a stream past a bound with one ``UpstreamError`` of code
``upstream_protocol_error``.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.errors import RemoteProtocolError
from sluicegate.core.events import DeltaParts, ToolCallFragment, join_all_parts
from sluicegate.core.events import join_parts as join_two
from sluicegate.core.upstream.items import (
    PROTOCOL_ERROR_CODE,
    ReaderState,
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamItem,
    UpstreamToolCall,
    UpstreamUsageRejected,
)
from sluicegate.core.upstream.limits import (
    MAX_TOOL_NAME_CHARS,
    ReaderLimits,
    UsageBounds,
    usage_problem,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint
from sluicegate.core.wire.sse import SSEDecoder

from .strategies import split_at

SMALL = ReaderLimits(
    max_line_bytes=2048,
    max_event_bytes=3072,
    max_deltas_per_chunk=8,
    max_tool_calls=3,
    max_response_bytes=16384,
)


def data(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def calls_chunk(*entries: dict[str, object], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"tool_calls": list(entries)}}
    return data({"choices": [{**choice, "finish_reason": finish}]})


def call(index: int, name: str | None, arguments: str = "") -> dict[str, object]:
    function: dict[str, object] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    return {"index": index, "function": function}


def text(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return data({"choices": [choice]})


DONE = b"data: [DONE]\n\n"


def reader(**options: object) -> UpstreamReader:
    options.setdefault("limits", SMALL)
    return UpstreamReader(Endpoint.CHAT, new_id=lambda: "call_made", **options)  # type: ignore[arg-type]


def protocol_error(items: list[UpstreamItem]) -> UpstreamError:
    assert items, "expected an error"
    last = items[-1]
    assert type(last) is UpstreamError
    assert last.code == PROTOCOL_ERROR_CODE
    return last


# -- SSEDecoder's bounds -----------------------------------------------------------


def test_a_line_that_never_ends_fails_once_past_its_bound_and_holds_no_more() -> None:
    decoder = SSEDecoder(max_line_bytes=100)
    decoder.feed(b"data: ")
    for _ in range(10):
        decoder.feed(b"x" * 9)
        assert decoder.held_bytes <= 100
    with pytest.raises(RemoteProtocolError, match="longer than 100 bytes"):
        decoder.feed(b"x" * 9)
    assert decoder.held_bytes == 0


def test_a_whole_line_past_its_bound_in_one_feed_fails() -> None:
    decoder = SSEDecoder(max_line_bytes=10)
    assert decoder.feed(b"data: abcd\n\n")[0].data == "abcd"
    with pytest.raises(RemoteProtocolError, match="longer than 10 bytes"):
        decoder.feed(b"data: abcde\n\n")


def test_line_bounds_count_utf8_bytes_not_characters() -> None:
    decoder = SSEDecoder(max_line_bytes=10)
    assert decoder.feed("data: é\n\n".encode())[0].data == "é"  # 8 bytes
    with pytest.raises(RemoteProtocolError):
        decoder.feed("data: ééé\n\n".encode())  # 12 bytes, 9 characters


def test_the_rest_of_a_line_after_a_line_end_is_bounded_too() -> None:
    decoder = SSEDecoder(max_line_bytes=10)
    with pytest.raises(RemoteProtocolError):
        decoder.feed(b"data: a\n" + b"y" * 11)


def test_an_event_of_many_data_lines_fails_past_its_bound() -> None:
    decoder = SSEDecoder(max_event_bytes=10)
    assert decoder.feed(b"data: abcd\ndata: efghi\n\n")[0].data == "abcd\nefghi"
    decoder.feed(b"data: abcd\ndata: efgh\n")
    assert decoder.held_bytes == 9
    with pytest.raises(RemoteProtocolError, match="more than 10 bytes of data"):
        decoder.feed(b"data: ij\n")


@pytest.mark.parametrize("bound", [0, -1])
def test_a_bound_below_one_is_refused(bound: int) -> None:
    with pytest.raises(ValueError, match="max_line_bytes"):
        SSEDecoder(max_line_bytes=bound)


def test_a_retry_of_more_than_18_digits_is_ignored() -> None:
    (event,) = SSEDecoder().feed(b"retry: " + b"9" * 5000 + b"\ndata: x\n\n")
    assert event.retry is None


# -- ReaderLimits ------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "8"])
def test_reader_limits_must_be_integers_of_at_least_one(value: object) -> None:
    with pytest.raises(ValueError, match="max_tool_calls >= 1"):
        ReaderLimits(max_tool_calls=value)  # type: ignore[arg-type]


# -- the reader's bounds -----------------------------------------------------------


def test_a_body_past_max_response_bytes_ends_the_stream() -> None:
    r = reader()
    items: list[UpstreamItem] = []
    for _ in range(400):
        items += r.feed(text("abcdefghij"))
        if r.state is not ReaderState.READING:
            break
    error = protocol_error(items)
    assert "longer than 16384 bytes" in error.message
    assert r.bytes > 16384
    assert r.feed(text("more")) == []


def test_a_long_line_in_one_chunk_is_an_error_on_the_fast_path_too() -> None:
    r = reader()
    assert r.feed(text("first")) == [UpstreamDelta(0, "first")]
    items = r.feed(text("ok") + text("x" * 3000))
    assert items[0] == UpstreamDelta(0, "ok")
    assert "longer than 2048 bytes" in protocol_error(items).message


def test_a_chunk_of_too_many_choices_is_an_error() -> None:
    choices = [{"index": 0, "delta": {"content": "a"}}] * 9
    items = reader().feed(data({"choices": choices}))
    assert "more than 8 deltas" in protocol_error(items).message
    assert len([i for i in items if type(i) is UpstreamDelta]) == 8


def test_a_chunk_of_too_many_tool_call_entries_is_an_error() -> None:
    entries = [call(0, "f", "x")] + [call(0, None, "y")] * 7
    items = reader().feed(calls_chunk(*entries))
    assert "more than 8 deltas" in protocol_error(items).message
    assert not any(type(i) is UpstreamToolCall for i in items)


def test_more_tool_calls_than_max_tool_calls_is_an_error() -> None:
    r = reader()
    items = r.feed(calls_chunk(call(0, "f", "{}"), call(1, "f", "{}")))
    assert len(items) == 4
    items = r.feed(calls_chunk(call(2, "f", "{}"), call(3, "f", "{}")))
    assert "more than 3 tool calls" in protocol_error(items).message


def test_a_tool_name_past_its_bound_is_an_error() -> None:
    r = reader()
    items: list[UpstreamItem] = []
    for _ in range(MAX_TOOL_NAME_CHARS + 1):
        items += r.feed(calls_chunk(call(0, "n")))
    assert "more than 64 characters" in protocol_error(items).message


def test_the_work_of_a_chunk_is_bounded_by_its_deltas() -> None:
    """100,000 tool-call entries: refused after the first ``max_deltas``."""
    entries = [call(0, "f", "x")] * 100_000
    r = reader(limits=ReaderLimits(max_line_bytes=8 << 20, max_event_bytes=8 << 20))
    items = r.feed(calls_chunk(*entries))
    assert "more than 1024 deltas" in protocol_error(items).message


# -- tools that were not offered ---------------------------------------------------


def test_a_call_to_an_offered_tool_goes_out() -> None:
    r = reader(tool_names=frozenset({"get_time"}))
    items = r.feed(calls_chunk(call(0, "get_time", "{}"), finish="tool_calls"))
    assert [type(i).__name__ for i in items] == [
        "UpstreamToolCall",
        "UpstreamToolCall",
        "UpstreamFinish",
    ]


def test_a_call_to_a_tool_not_offered_never_goes_out() -> None:
    r = reader(tool_names=frozenset({"get_time"}))
    items = r.feed(text("hi") + calls_chunk(call(0, "rm_rf", "{}")))
    assert items[0] == UpstreamDelta(0, "hi")
    error = protocol_error(items)
    assert "'rm_rf', which the request did not offer" in error.message
    assert not any(type(i) is UpstreamToolCall for i in items)


@pytest.mark.parametrize(
    ("ending", "expected"),
    [
        (calls_chunk(finish="tool_calls"), "finish"),
        (DONE, "done"),
        (b"", "end of body"),
    ],
)
def test_a_held_call_named_in_pieces_is_checked_when_the_choice_ends(
    ending: bytes, expected: str
) -> None:
    """A name in pieces is held until the choice ends; at its end (a finish,
    ``[DONE]`` or the body's end) a name not offered is the error."""
    r = reader(tool_names=frozenset({"get_time"}))
    items = r.feed(calls_chunk(call(0, "rm")) + calls_chunk(call(0, "_rf")) + ending)
    items += r.flush()
    assert "'rm_rf'" in protocol_error(items).message, expected
    assert not any(type(i) in (UpstreamToolCall, UpstreamDone) for i in items)


def test_a_held_call_not_offered_is_dropped_when_the_stream_fails_anyway() -> None:
    r = reader(tool_names=frozenset({"get_time"}))
    items = r.feed(calls_chunk(call(0, "rm_rf")) + data({"error": "boom"}))
    assert items == [UpstreamError("boom", "server_error", None)]


# -- usage -------------------------------------------------------------------------

BOUNDS = UsageBounds(max_completion_tokens=100, context_tokens=1000)


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        ({"prompt_tokens": "4"}, "prompt_tokens is not a token count: '4'"),
        ({"completion_tokens": 2.0}, "completion_tokens is not a token count"),
        ({"completion_tokens": False}, "not a token count: False"),
        ({"prompt_tokens": -1}, "not a token count: -1"),
        ({"prompt_tokens": 1 << 63}, "count: 9223372036854775808"),
        ({"prompt_tokens": 1 << 200}, "an integer of 201 bits"),
        ({"prompt_tokens": [1] * 100}, "not a token count: [1, 1"),
        ({"completion_tokens": 101}, "past the max_tokens asked for, 100"),
        ({"prompt_tokens": 950, "completion_tokens": 51}, "context window, 1000"),
        ({"completion_tokens": 60}, "more than the 50 bytes"),
    ],
)
def test_a_usage_that_cannot_be_true_says_why(
    usage: dict[str, object], why: str
) -> None:
    problem, prompt, completion = usage_problem(usage, BOUNDS, 50)
    assert problem is not None
    assert why in problem
    assert (prompt, completion) == (0, 0)


def test_prompt_tokens_past_what_the_prompt_holds_cannot_be_true() -> None:
    """No window known: the prompt's own bound (bytes and template tokens)."""
    bounds = UsageBounds(max_prompt_tokens=500)
    problem, *counts = usage_problem({"prompt_tokens": 10**12}, bounds, 50)
    assert problem is not None
    assert "more than the prompt sent can hold, 500" in problem
    assert counts == [0, 0]
    assert usage_problem({"prompt_tokens": 500}, bounds, 50) == (None, 500, 0)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({}, (0, 0)),
        ({"prompt_tokens": 950, "completion_tokens": 50}, (950, 50)),
        (
            {
                "prompt_tokens": 3,
                "completion_tokens": 90,
                "completion_tokens_details": {"reasoning_tokens": 80},
            },
            (3, 90),
        ),
    ],
)
def test_a_usage_that_can_be_true_passes(
    usage: dict[str, object], expected: tuple[int, int]
) -> None:
    assert usage_problem(usage, BOUNDS, 50) == (None, *expected)


@pytest.mark.parametrize(
    "details",
    [None, [], {"reasoning_tokens": "80"}, {"reasoning_tokens": 91}, {}],
)
def test_reasoning_tokens_that_cannot_be_read_count_as_streamed(
    details: object,
) -> None:
    usage = {"completion_tokens": 90, "completion_tokens_details": details}
    problem, _, _ = usage_problem(usage, UsageBounds(), 50)
    assert problem is not None
    assert "more than the 50 bytes" in problem


def test_without_bounds_only_the_bytes_streamed_bound_the_completion() -> None:
    assert usage_problem({"completion_tokens": 10**6}, UsageBounds(), 10**6)[0] is None


def test_the_reader_rejects_a_usage_once_and_trusts_none_after_it() -> None:
    r = reader(usage_bounds=UsageBounds(max_completion_tokens=5))
    good = {"prompt_tokens": 3, "completion_tokens": 1}
    bad = {"prompt_tokens": 3, "completion_tokens": 9}
    items = r.feed(data({"choices": [], "usage": good}))
    first = r.usage
    items += r.feed(data({"choices": [], "usage": bad}))
    items += r.feed(data({"choices": [], "usage": good}) + DONE)
    assert [type(i).__name__ for i in items] == [
        "Usage",
        "UpstreamUsageRejected",
        "UpstreamDone",
    ]
    assert first is not None
    assert (r.usage, items[0]) == (None, first)
    assert r.usage_rejected is not None
    assert "past the max_tokens asked for, 5" in r.usage_rejected
    assert items[1] == UpstreamUsageRejected(r.usage_rejected)


# -- join_all_parts: linear, and the same as folding join_parts --------------------


def test_join_all_parts_of_none_or_one() -> None:
    one = DeltaParts((ToolCallFragment(0, "c", "f"),))
    assert join_all_parts([]) is None
    assert join_all_parts([None, None]) is None
    assert join_all_parts([None, one]) is one


fragments = st.builds(
    ToolCallFragment,
    st.integers(0, 3),
    st.none() | st.sampled_from(["c1", "c2"]),
    st.none() | st.sampled_from(["f", "g"]),
    st.text(max_size=3),
)
parts_lists = st.lists(
    st.none()
    | st.builds(DeltaParts, st.lists(fragments, max_size=3).map(tuple), st.text()),
    max_size=6,
)


@given(parts_lists)
def test_join_all_parts_is_join_parts_folded(parts: list[DeltaParts | None]) -> None:
    folded: DeltaParts | None = None
    for p in parts:
        # join_parts keeps one fragment per index per side: feed it that way
        if p is not None:
            for f in p.tool_calls:
                folded = join_two(folded, DeltaParts((f,)))
            folded = join_two(folded, DeltaParts((), p.reasoning))
    joined = join_all_parts(
        [DeltaParts((f,)) for p in parts if p for f in p.tool_calls]
        + [DeltaParts((), "".join(p.reasoning for p in parts if p))]
    )
    if folded is None or not folded:
        assert joined is None or not joined
        return
    assert joined == folded


# -- a hostile body, in any split --------------------------------------------------

HOSTILE_PIECES = [
    text("hi"),
    text("x" * 3000),
    calls_chunk(call(0, "f", "{")),
    calls_chunk(*[call(i, "f", "x") for i in range(9)]),
    calls_chunk(call(5, "not_offered", "{}")),
    calls_chunk(call(6, "n" * 70)),
    b'data: {"choices": [], "usage": {"prompt_tokens": -1}}\n\n',
    b'data: {"choices": [], "usage": {"prompt_tokens": 99999999999999999999999}}\n\n',
    data({"choices": [], "usage": {"completion_tokens": "\u2075\u2070\u2073"}}),
    data({"error": {"message": "m", "code": "\u2075\u2070\u2073"}}),
    b"data: " + b"[" * 2000 + b"\n\n",
    b"retry: " + b"9" * 5000 + b"\n",
    b"data: " + b"y" * 2100,
    b"event: error\ndata: nope\n\n",
    b"\xff\xfe",
    b": keep-alive\r\n\r\n",
    "data: \u00e9\u20ac\U0001f600\n\n".encode(),
    DONE,
]


@given(
    st.lists(st.sampled_from(HOSTILE_PIECES) | st.binary(max_size=64), max_size=12).map(
        b"".join
    ),
    st.lists(st.integers(0, 4096), max_size=12),
    st.sampled_from([None, frozenset({"f"})]),
)
def test_any_bytes_in_any_split_raise_nothing_and_hold_no_more_than_the_bounds(
    body: bytes, cuts: list[int], tool_names: frozenset[str] | None
) -> None:
    r = reader(tool_names=tool_names, usage_bounds=UsageBounds(100, 1000))
    items: list[UpstreamItem] = []
    for part in split_at(body, cuts):
        items += r.feed(part)
        assert r.held_bytes <= SMALL.max_line_bytes + SMALL.max_event_bytes
    items += r.flush()
    ends = [i for i in items if type(i) in (UpstreamError, UpstreamDone)]
    assert len(ends) <= 1
    if ends:
        assert items[-1] is ends[0]
    for item in items:
        if type(item) is UpstreamToolCall and item.fragment.name is not None:
            assert tool_names is None or item.fragment.name in tool_names
            assert len(item.fragment.name) <= MAX_TOOL_NAME_CHARS


def test_tool_calls_that_are_not_a_list_count_as_no_delta_and_are_ignored() -> None:
    choice = {
        "index": 0,
        "delta": {"tool_calls": {"index": 0}},
        "finish_reason": "stop",
    }
    items = reader().feed(data({"choices": [choice]}) + DONE)
    assert [type(i).__name__ for i in items] == ["UpstreamFinish", "UpstreamDone"]
