"""The upstream reader holds a choice to the request's ``max_tokens``.

An upstream sends at most one chunk with output (text, reasoning, tool-call
fragments) per token and part (reasoning, content, each call: llama.cpp's
server writes one chunk per part a token changes), so a choice is cut at its
first output chunk past ``max_tokens`` that does not begin a later part: it
finishes ``LENGTH`` (``UpstreamFinish.cut``) and that chunk and the rest of it
are dropped, whichever path (fast or full parse) reads the chunks.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from sluicegate.core.events import FinishReason
from sluicegate.core.upstream.items import (
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamReasoning,
    UpstreamToolCall,
)
from sluicegate.core.upstream.limits import UsageBounds
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint

CUT = UpstreamFinish(0, FinishReason.LENGTH, "length", None, True)


def data(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": delta, "finish_reason": finish}
    return b"data: " + orjson.dumps({"id": "c", "choices": [choice]}) + b"\n\n"


def read(body: bytes, max_tokens: int, *, whole: bool = True, **kw: Any) -> list[Any]:
    """The items of ``body``: fed an event at a time (the fast path reads what
    it can), or a byte at a time (the full parse reads every chunk)."""
    reader = UpstreamReader(
        Endpoint.CHAT, usage_bounds=UsageBounds(max_tokens), new_id=lambda: "id", **kw
    )
    events = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
    pieces = events if whole else [body[i : i + 1] for i in range(len(body))]
    items: list[UpstreamItem] = []
    for piece in pieces:
        items += reader.feed(piece)
    return items + reader.flush()


def overrun(delta: dict[str, Any], count: int = 50) -> bytes:
    role = data({"role": "assistant", "content": ""})
    return role + data(delta) * count + data({}, "length") + b"data: [DONE]\n\n"


@pytest.mark.parametrize("whole", [True, False])
def test_content_past_max_tokens_is_cut(whole: bool) -> None:
    items = read(overrun({"content": "w "}), 5, whole=whole)
    assert items == [*[UpstreamDelta(0, "w ")] * 5, CUT, UpstreamDone()]


def test_reasoning_past_max_tokens_is_cut() -> None:
    items = read(overrun({"reasoning_content": "r"}), 3)
    assert items == [*[UpstreamReasoning(0, "r")] * 3, CUT, UpstreamDone()]


def test_tool_call_fragments_past_max_tokens_are_cut() -> None:
    start = {"index": 0, "id": "x", "function": {"name": "f", "arguments": "{"}}
    more = {"index": 0, "function": {"arguments": '"a'}}
    body = data({"tool_calls": [start]}) + overrun({"tool_calls": [more]})
    items = read(body, 4)
    calls = [i for i in items if type(i) is UpstreamToolCall]
    assert "".join(c.fragment.arguments or "" for c in calls) == '{"a"a"a'
    assert items[-2:] == [CUT, UpstreamDone()]


def test_merged_tokens_in_fewer_chunks_than_max_tokens_are_not_cut() -> None:
    body = overrun({"content": "w w "}, count=2)  # 4 tokens in 2 chunks
    assert read(body, 4) == [
        *[UpstreamDelta(0, "w w ")] * 2,
        UpstreamFinish(0, FinishReason.LENGTH, "length"),
        UpstreamDone(),
    ]


def test_the_upstreams_own_finish_on_the_last_chunk_stands() -> None:
    body = data({"content": "a"}) + data({"content": "b"}, "stop")
    body += b"data: [DONE]\n\n"
    assert read(body, 2) == [
        UpstreamDelta(0, "a"),
        UpstreamDelta(0, "b"),
        UpstreamFinish(0, FinishReason.STOP, "stop"),
        UpstreamDone(),
    ]


def test_each_choice_is_cut_on_its_own() -> None:
    body = data({"content": "a"}, index=1) + data({"content": "b"}) * 3
    items = read(body + data({"content": "c"}, index=1) * 2, 2)
    assert items[:4] == [
        UpstreamDelta(1, "a"),
        UpstreamDelta(0, "b"),
        UpstreamDelta(0, "b"),
        CUT,
    ]
    assert items[4:6] == [
        UpstreamDelta(1, "c"),
        UpstreamFinish(1, FinishReason.LENGTH, "length", None, True),
    ]


def test_a_cut_that_refuses_a_held_call_fails_the_stream_on_the_fast_path() -> None:
    # The call's start waits for its name, which never comes whole; the cut,
    # on a chunk the fast path reads, flushes it and finds it not offered.
    held = {"index": 0, "id": "x", "function": {"name": "ge", "arguments": ""}}
    body = data({"tool_calls": [held]}) + data({"content": "a"}) * 4
    items = read(body, 3, tool_names=frozenset({"get_weather"}))
    assert type(items[-1]) is UpstreamError
    assert [type(i) for i in items] == [UpstreamDelta, UpstreamDelta, UpstreamError]


@pytest.mark.parametrize("whole", [True, False])
def test_a_token_that_ends_the_reasoning_and_begins_the_content_is_not_cut(
    whole: bool,
) -> None:
    """llama.cpp's server writes one chunk per part a token changes: the last
    of three tokens ends the reasoning and begins the content, two chunks. The
    upstream's own finish stands; the reader cut the content away."""
    body = data({"reasoning_content": "r"}) * 2
    body += data({"reasoning_content": "r."}) + data({"content": "A"})
    body += data({}, "length") + b"data: [DONE]\n\n"
    items = read(body, 3, whole=whole)
    assert items[-3:] == [
        UpstreamDelta(0, "A"),
        UpstreamFinish(0, FinishReason.LENGTH, "length"),
        UpstreamDone(),
    ]


def test_a_token_that_ends_a_call_and_begins_the_next_is_not_cut() -> None:
    """Two chunks of one token: the first call's last arguments, then the
    second call's start (one chunk per call a token changes)."""
    first = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}
    second = {"index": 1, "id": "b", "function": {"name": "f", "arguments": "{}"}}
    body = data({"tool_calls": [first]})
    body += data({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]})
    body += data({"tool_calls": [second]}) + data({}, "tool_calls")
    items = read(body + b"data: [DONE]\n\n", 2)
    assert items[-2:] == [
        UpstreamFinish(0, FinishReason.TOOL_CALLS, "tool_calls"),
        UpstreamDone(),
    ]
    assert len([i for i in items if type(i) is UpstreamToolCall]) == 5


@pytest.mark.parametrize("whole", [True, False])
def test_only_the_first_chunk_of_a_later_part_goes_uncounted(whole: bool) -> None:
    """Reasoning, then 50 content chunks, 5 tokens asked: the reasoning and 5
    content chunks (the first of them uncounted), then the cut."""
    body = data({"reasoning_content": "r"}) * 2 + overrun({"content": "w "})
    items = read(body, 5, whole=whole)
    assert items == [
        *[UpstreamReasoning(0, "r")] * 2,
        *[UpstreamDelta(0, "w ")] * 4,
        CUT,
        UpstreamDone(),
    ]


def test_a_chunk_past_max_tokens_that_continues_a_call_is_cut() -> None:
    start = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}
    more = {"index": 0, "function": {"arguments": "1"}}
    body = data({"tool_calls": [start]}) + data({"tool_calls": [more]}) * 3
    items = read(body + b"data: [DONE]\n\n", 2)
    assert items[-2:] == [CUT, UpstreamDone()]
    calls = [i for i in items if type(i) is UpstreamToolCall]
    assert "".join(c.fragment.arguments or "" for c in calls) == "{1"
