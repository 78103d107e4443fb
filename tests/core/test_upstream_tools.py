"""An upstream's tool calls: whatever shape it streams them in, the local shape out."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.response import ChoiceOptions, ResponseDecoder
from sluicegate.core.decoding.tooldecoder import ToolCallDecoder, ToolCallOptions
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    ToolCallFragment,
    Usage,
    join_parts,
)
from sluicegate.core.upstream.items import (
    UpstreamDelta,
    UpstreamDone,
    UpstreamError,
    UpstreamFinish,
    UpstreamItem,
    UpstreamToolCall,
    UpstreamTruncated,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.upstream.tools import ToolCallNormalizer
from sluicegate.core.wire.chunks import Endpoint

DONE = b"data: [DONE]\n\n"
WEATHER = '{"city": "Paris"}'


def ids() -> Callable[[], str]:
    """A fresh ``new_id``: ``made_0``, ``made_1``, ..."""
    counter: Iterator[int] = iter(range(1000))
    return lambda: f"made_{next(counter)}"


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def calls_chunk(*entries: dict[str, Any], finish: str | None = None) -> bytes:
    delta: dict[str, Any] = {"tool_calls": list(entries)} if entries else {}
    return event({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


def entry(
    index: int | None = 0,
    id: str | None = None,
    name: str | None = None,
    arguments: Any = None,
) -> dict[str, Any]:
    """One ``delta.tool_calls`` entry, with only the fields given."""
    out: dict[str, Any] = {}
    if index is not None:
        out["index"] = index
    if id is not None:
        out.update(id=id, type="function")
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    if function:
        out["function"] = function
    return out


def read(body: bytes, endpoint: Endpoint = Endpoint.CHAT) -> list[UpstreamItem]:
    reader = UpstreamReader(endpoint, new_id=ids())
    return reader.feed(body) + reader.flush()


def fragments(items: list[UpstreamItem]) -> list[ToolCallFragment]:
    return [i.fragment for i in items if isinstance(i, UpstreamToolCall)]


def joined(items: list[UpstreamItem]) -> list[tuple[str | None, str | None, str]]:
    """Each call's id, name and arguments, its fragments joined as a client does."""
    parts: DeltaParts | None = None
    for fragment in fragments(items):
        parts = join_parts(parts, DeltaParts((fragment,)))
    calls = () if parts is None else parts.tool_calls
    assert [c.index for c in calls] == list(range(len(calls)))
    return [(c.id, c.name, c.arguments) for c in calls]


def assert_local_shape(items: list[UpstreamItem]) -> None:
    """Starts carry id and name with no arguments; the rest only arguments."""
    started = -1
    for fragment in fragments(items):
        if fragment.id is not None:
            assert fragment.name
            assert fragment.arguments == ""
            assert fragment.index == started + 1
            started = fragment.index
        else:
            assert fragment.name is None
            assert 0 <= fragment.index <= started
            assert fragment.arguments


def finish_of(items: list[UpstreamItem]) -> FinishReason:
    (finish,) = [i for i in items if isinstance(i, UpstreamFinish)]
    return finish.finish_reason


# -- examples -------------------------------------------------------------------

OPENAI = (
    calls_chunk(entry(0, "call_a", "get_weather", ""))
    + calls_chunk(entry(0, arguments='{"city": '))
    + calls_chunk(entry(0, arguments='"Paris"}'))
    + calls_chunk(entry(1, "call_b", "get_time", ""))
    + calls_chunk(entry(1, arguments="{}"))
    + calls_chunk(finish="tool_calls")
    + DONE
)


def test_an_openai_shaped_stream_keeps_its_shape() -> None:
    items = read(OPENAI)
    assert items == [
        UpstreamToolCall(0, ToolCallFragment(0, "call_a", "get_weather")),
        UpstreamToolCall(0, ToolCallFragment(0, arguments='{"city": ')),
        UpstreamToolCall(0, ToolCallFragment(0, arguments='"Paris"}')),
        UpstreamToolCall(0, ToolCallFragment(1, "call_b", "get_time")),
        UpstreamToolCall(0, ToolCallFragment(1, arguments="{}")),
        UpstreamFinish(0, FinishReason.TOOL_CALLS, "tool_calls"),
        UpstreamDone(),
    ]


def test_id_and_name_repeated_on_every_chunk_come_once() -> None:
    body = (
        calls_chunk(entry(0, "call_a", "get_weather", '{"city": '))
        + calls_chunk(entry(0, "call_a", "get_weather", '"Paris"}'))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    items = read(body)
    assert_local_shape(items)
    assert joined(items) == [("call_a", "get_weather", WEATHER)]
    assert len(fragments(items)) == 3  # the start, then the two pieces


def test_a_name_in_pieces_is_held_until_it_is_whole() -> None:
    body = (
        calls_chunk(entry(0, "call_a", "get_"))
        + calls_chunk(entry(0, name="weather"))
        + calls_chunk(entry(0, arguments=WEATHER))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    reader = UpstreamReader(Endpoint.CHAT)
    assert reader.feed(body[: body.index(b'"arguments"')]) == []  # held
    items = read(body)
    assert fragments(items) == [
        ToolCallFragment(0, "call_a", "get_weather"),
        ToolCallFragment(0, arguments=WEATHER),
    ]


def test_a_name_sent_cumulatively_is_taken_once() -> None:
    body = (
        calls_chunk(entry(0, "call_a", "get_"))
        + calls_chunk(entry(0, name="get_weather", arguments="{}"))
        + calls_chunk(finish="stop")
        + DONE
    )
    assert joined(read(body)) == [("call_a", "get_weather", "{}")]


def test_a_missing_id_is_made_and_sent_once() -> None:
    body = (
        calls_chunk(entry(0, name="get_weather", arguments=WEATHER))
        + calls_chunk(entry(1, id="", name="get_time", arguments="{}"))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    items = read(body)
    assert_local_shape(items)
    assert joined(items) == [
        ("made_0", "get_weather", WEATHER),
        ("made_1", "get_time", "{}"),
    ]


def test_without_indexes_a_new_id_begins_a_new_call() -> None:
    body = (
        calls_chunk(entry(None, "call_a", "get_weather", ""))
        + calls_chunk(entry(None, arguments=WEATHER))
        + calls_chunk(entry(None, "call_b", "get_time", "{}"))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    assert joined(read(body)) == [
        ("call_a", "get_weather", WEATHER),
        ("call_b", "get_time", "{}"),
    ]


def test_every_call_numbered_0_with_its_own_id_is_apart() -> None:
    body = (
        calls_chunk(entry(0, "call_a", "get_weather", WEATHER))
        + calls_chunk(entry(0, "call_b", "get_time", "{}"))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    assert joined(read(body)) == [
        ("call_a", "get_weather", WEATHER),
        ("call_b", "get_time", "{}"),
    ]


def test_a_content_filter_finish_is_kept() -> None:
    body = event({"choices": [{"index": 0, "delta": {"content": "a"}}]})
    body += calls_chunk(finish="content_filter") + DONE
    assert finish_of(read(body)) is FinishReason.CONTENT_FILTER


def test_an_id_another_call_has_is_replaced_by_a_made_one() -> None:
    """Two calls of one id (and a third choice's call with it too): each
    later one gets a made id on its start, its arguments still its own."""
    body = (
        calls_chunk(entry(0, "same", "get_weather", ""))
        + calls_chunk(entry(0, arguments=WEATHER))
        + calls_chunk(entry(1, "same", "get_time", ""))
        + calls_chunk(entry(1, "same", arguments="{}"))
        + event(
            {
                "choices": [
                    {
                        "index": 1,
                        "delta": {"tool_calls": [entry(0, "same", "get_time", "{}")]},
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        )
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    calls = [i for i in read(body) if isinstance(i, UpstreamToolCall)]
    for choice in (0, 1):
        assert_local_shape([i for i in calls if i.index == choice])
    assert joined([i for i in calls if i.index == 0]) == [
        ("same", "get_weather", WEATHER),
        ("made_0", "get_time", "{}"),
    ]
    assert joined([i for i in calls if i.index == 1]) == [("made_1", "get_time", "{}")]


def test_upstream_indexes_with_gaps_are_renumbered_from_0() -> None:
    body = (
        calls_chunk(entry(3, "call_a", "get_weather", ""))
        + calls_chunk(entry(7, "call_b", "get_time", ""))
        + calls_chunk(entry(3, arguments=WEATHER))  # interleaved
        + calls_chunk(entry(7, arguments="{}"))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    items = read(body)
    assert_local_shape(items)
    assert joined(items) == [
        ("call_a", "get_weather", WEATHER),
        ("call_b", "get_time", "{}"),
    ]


def test_arguments_as_an_object_are_encoded_once() -> None:
    body = (
        calls_chunk(entry(0, "call_a", "get_weather", {"city": "Paris"}))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    assert joined(read(body)) == [("call_a", "get_weather", '{"city":"Paris"}')]


def test_a_call_that_never_gets_a_name_is_dropped() -> None:
    body = (
        calls_chunk(entry(0, "call_a", arguments="{"))
        + calls_chunk(entry(1, "call_b", "get_time", "{}"))
        + calls_chunk(entry(0, arguments="}"))  # the dropped call's: dropped too
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    assert joined(read(body)) == [("call_b", "get_time", "{}")]


@pytest.mark.parametrize(
    ("reason", "arguments", "expected"),
    [
        ("tool_calls", WEATHER, FinishReason.TOOL_CALLS),
        ("stop", WEATHER, FinishReason.TOOL_CALLS),
        ("function_call", "", FinishReason.TOOL_CALLS),  # no arguments: whole
        ("length", WEATHER, FinishReason.LENGTH),
        ("length", '{"ci', FinishReason.LENGTH),
        # llama-cpp-python's word when max_tokens cuts a call:
        ("tool_calls", '{ "', FinishReason.LENGTH),
        # a call left open by a model that stopped (as the local engine says):
        ("stop", '{"ci', FinishReason.STOP),
        ("tool_calls", None, FinishReason.STOP),  # no call at all
    ],
)
def test_the_finish_says_tool_calls_only_for_calls_not_cut_short(
    reason: str, arguments: str | None, expected: FinishReason
) -> None:
    first = (
        calls_chunk(entry(0, "call_a", "get_weather", arguments))
        if arguments is not None
        else event({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
    )
    assert finish_of(read(first + calls_chunk(finish=reason) + DONE)) == expected


@pytest.mark.parametrize(
    ("ending", "last"),
    [
        (DONE, UpstreamDone()),
        (b"", UpstreamTruncated()),
        (event({"error": {"message": "oom"}}), UpstreamError("oom")),
    ],
)
def test_a_held_start_goes_out_before_the_end(ending: bytes, last: object) -> None:
    items = read(calls_chunk(entry(0, "call_a", "get_time")) + ending)
    assert items == [
        UpstreamToolCall(0, ToolCallFragment(0, "call_a", "get_time")),
        last,
    ]


def test_content_and_calls_of_one_chunk_both_come() -> None:
    chunk = {
        "choices": [
            {
                "index": 0,
                "delta": {
                    "content": "Checking.",
                    "tool_calls": [entry(0, "call_a", "get_time", "{}")],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    assert read(event(chunk) + DONE) == [
        UpstreamDelta(0, "Checking."),
        UpstreamToolCall(0, ToolCallFragment(0, "call_a", "get_time")),
        UpstreamToolCall(0, ToolCallFragment(0, arguments="{}")),
        UpstreamFinish(0, FinishReason.TOOL_CALLS, "tool_calls"),
        UpstreamDone(),
    ]


def test_completions_have_no_tool_calls() -> None:
    chunk = {"choices": [{"index": 0, "text": "a", "delta": {"tool_calls": []}}]}
    assert read(event(chunk) + DONE, Endpoint.COMPLETION) == [
        UpstreamDelta(0, "a"),
        UpstreamDone(),
    ]


def test_entries_that_are_not_calls_are_ignored() -> None:
    normalizer = ToolCallNormalizer(ids())
    assert normalizer.feed({"index": 0}) == []
    assert normalizer.feed([1, "x", None, {"index": 0, "function": "f"}]) == []
    assert normalizer.feed([entry(0, name="f", arguments="")]) == []
    assert normalizer.flush() == [ToolCallFragment(0, "made_0", "f")]
    assert normalizer.calls == 1


def test_the_normalizer_is_done_after_flush() -> None:
    normalizer = ToolCallNormalizer()
    normalizer.flush()
    with pytest.raises(LocalProtocolError, match="after flush"):
        normalizer.feed([])
    with pytest.raises(LocalProtocolError, match="twice"):
        normalizer.flush()


# -- the same stream events as the local engine's calls --------------------------


def upstream_events(body: bytes) -> list[StreamEvent]:
    """What the response decoder makes of the upstream's items (as the engine
    hands them over: one fragment per ``TextOutput``)."""
    decoder = ResponseDecoder([ChoiceOptions()], None, prompt_tokens=0)
    events: list[StreamEvent] = []
    for item in read(body):
        if isinstance(item, UpstreamToolCall):
            output = TextOutput("", None, 1, None, (item.fragment,))
        elif isinstance(item, UpstreamDelta):
            output = TextOutput(item.text)
        elif isinstance(item, UpstreamFinish):
            output = TextOutput("", item.finish_reason, 0, 5)
        else:
            continue
        events += decoder.feed(0, output)
    return events


def local_events(text: str, tokens: int) -> list[StreamEvent]:
    tools = ToolCallOptions(("get_weather", "get_time"))
    decoder = ToolCallDecoder(
        [ChoiceOptions()], None, tools=tools, new_id=ids(), prompt_tokens=5
    )
    return list(decoder.feed(0, TextOutput(text, FinishReason.STOP, tokens)))


def test_an_upstreams_calls_become_the_local_engines_stream_events() -> None:
    body = (
        calls_chunk(entry(0, id=None, name="get_weather", arguments=""))
        + calls_chunk(entry(0, arguments=WEATHER))
        + calls_chunk(entry(1, name="get_time", arguments="{}"))
        + calls_chunk(finish="tool_calls")
        + DONE
    )
    blocks = (
        f'<tool_call>{{"name": "get_weather", "arguments": {WEATHER}}}</tool_call>'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    upstream, local = upstream_events(body), local_events(blocks, 4)
    assert [e for e in upstream if isinstance(e, Delta)] == [
        e for e in local if isinstance(e, Delta)
    ]
    assert upstream[-2:] == local[-2:]  # Finish(tool_calls), End
    assert isinstance(upstream[-2], Finish)
    assert upstream[-2].finish_reason is FinishReason.TOOL_CALLS


START = (ToolCallFragment(0, "call_a", "get_time"),)


def test_calls_of_the_step_that_matched_a_stop_string_are_dropped() -> None:
    decoder = ResponseDecoder([ChoiceOptions()], None, prompt_tokens=0, stops=["!"])
    events = decoder.feed(0, TextOutput("hi!", None, 1, None, START))
    stopped = Finish(0, FinishReason.STOP, stop_sequence="!")
    assert events == [Delta(0, "hi"), stopped, End(Usage(0, 1))]
    assert decoder.stop_sequences == ("!",)
    assert decoder.feed(0, TextOutput("", None, 1, None, START)) == ()


def test_calls_on_the_last_output_go_out_before_its_finish() -> None:
    decoder = ResponseDecoder([ChoiceOptions()], None, prompt_tokens=0)
    events = decoder.feed(0, TextOutput("", FinishReason.TOOL_CALLS, 1, 4, START))
    assert events == [
        Delta(0, "", None, None, DeltaParts(START)),
        Finish(0, FinishReason.TOOL_CALLS),
        End(Usage(4, 1)),
    ]


# -- properties ------------------------------------------------------------------

names = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
arguments = st.one_of(
    st.text(alphabet='{}[]":, ab1\\é', max_size=12),
    st.dictionaries(names, st.integers(-1000, 1000) | names, max_size=3).map(
        lambda d: orjson.dumps(d).decode()
    ),
)
STYLES = (
    "openai",
    "repeat",
    "name_pieces",
    "no_id",
    "no_index",
    "shared_index",
    "same_id",
)


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` cut into non-empty pieces."""
    if not text:
        return []
    cuts = sorted(set(draw(st.lists(st.integers(1, len(text)), max_size=4))))
    bounds = [0, *cuts] if cuts[-1:] == [len(text)] else [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def whole(arguments: str) -> bool:
    try:
        orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments == ""
    return True


Stream = tuple[bytes, list[tuple[str, str, str]], FinishReason]


@st.composite
def tool_streams(draw: st.DrawFn) -> Stream:
    """A stream of calls in one upstream's style, the calls it holds, and the
    finish reason it must end with."""
    calls = [
        (n, draw(arguments)) for n in draw(st.lists(names, min_size=1, max_size=3))
    ]

    style = draw(st.sampled_from(STYLES))
    body = b""
    expected: list[tuple[str, str, str]] = []
    made = 0
    for i, (name, args) in enumerate(calls):
        index = None if style == "no_index" else 0 if style == "shared_index" else i
        upstream_id = {"no_id": None, "same_id": "same"}.get(style, f"up_{i}")
        if upstream_id is None or (style == "same_id" and i > 0):
            expected.append((f"made_{made}", name, args))
            made += 1
        else:
            expected.append((upstream_id, name, args))
        split_name = pieces(draw, name) if style == "name_pieces" else [name]
        body += calls_chunk(entry(index, upstream_id, split_name[0], ""))
        for piece in split_name[1:]:
            body += calls_chunk(entry(index, name=piece))
        for piece in pieces(draw, args):
            if style == "repeat":
                body += calls_chunk(entry(index, upstream_id, name, piece))
            else:
                body += calls_chunk(entry(index, arguments=piece))
    reason = draw(st.sampled_from(["tool_calls", "stop"]))
    body += calls_chunk(finish=reason) + DONE
    if all(whole(args) for _, args in calls):
        finish = FinishReason.TOOL_CALLS
    else:
        finish = FinishReason.LENGTH if reason == "tool_calls" else FinishReason.STOP
    return body, expected, finish


@given(tool_streams(), st.data())
def test_any_style_and_any_split_give_the_calls_in_the_local_shape(
    stream: Stream, data: st.DataObject
) -> None:
    body, expected, finish = stream
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=8)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    reader = UpstreamReader(Endpoint.CHAT, new_id=ids())
    items: list[UpstreamItem] = []
    for part in parts:
        items += reader.feed(part)
    items += reader.flush()
    assert items == read(body)
    assert_local_shape(items)
    assert joined(items) == expected
    assert finish_of(items) is finish
    started = [f.id for f in fragments(items) if f.id is not None]
    assert len(set(started)) == len(started)


def test_begins_says_whether_a_chunk_begins_a_call_and_changes_nothing() -> None:
    tools = ToolCallNormalizer(lambda: "id")
    assert not tools.begins("not a list")
    assert not tools.begins([1, "entries that are not objects"])
    assert tools.begins([None, {"index": 0, "id": "a"}])
    tools.feed([{"index": 0, "id": "a", "function": {"name": "f"}}])
    assert not tools.begins([{"index": 0, "function": {"arguments": "{"}}])
    assert tools.begins([{"index": 0, "id": "b"}])  # another id: another call
    assert tools.begins([{"index": 1}])
    assert tools.begun == 1
