"""The tool-call parser: content and calls out of a model's text, any split."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.toolcalls import (
    CLOSE_TAG,
    MAX_HEAD_CHARS,
    OPEN_TAG,
    Part,
    ToolCallParser,
    new_call_id,
)
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import ToolCallFragment
from tests.core.strategies import every_split, partitions

NAMES = ("get_weather", "f", "search-web")


@dataclass(frozen=True)
class Parsed:
    """What a choice's parts say, joined: content, and each call by index."""

    content: str
    calls: tuple[tuple[str, str, str], ...]  # (id, name, arguments)
    parts: tuple[Part, ...]


def _parser(**options: Any) -> ToolCallParser:
    counter = itertools.count()
    return ToolCallParser(NAMES, new_id=lambda: f"call_{next(counter)}", **options)


def parse(pieces: Iterable[str], **options: Any) -> Parsed:
    parser = _parser(**options)
    parts: list[Part] = []
    for piece in [*pieces, None]:
        step = parser.flush() if piece is None else parser.feed(piece)
        for before, after in itertools.pairwise(step):
            assert not (isinstance(before, str) and isinstance(after, str))
        assert "" not in step
        parts += step
    return joined(parts)


def joined(parts: Sequence[Part]) -> Parsed:
    content = "".join(p for p in parts if isinstance(p, str))
    calls: dict[int, list[str]] = {}
    for part in parts:
        if isinstance(part, ToolCallFragment):
            if part.id is not None:
                assert part.index not in calls, "an id comes once per call"
                assert part.name is not None
                assert part.arguments == "", "a call's start carries no arguments"
                calls[part.index] = [part.id, part.name, ""]
            else:
                assert part.name is None, "a name comes once, with the id"
                calls[part.index][2] += part.arguments
    assert list(calls) == list(range(len(calls))), "indexes count from 0 in order"
    return Parsed(content, tuple((i, n, a) for i, n, a in calls.values()), tuple(parts))


def whole(text: str, **options: Any) -> Parsed:
    return parse([text], **options)


def block(name: str, arguments: str) -> str:
    return f'{OPEN_TAG}{{"name": "{name}", "arguments": {arguments}}}{CLOSE_TAG}'


# -- examples ---------------------------------------------------------------


def test_a_call_streams_its_start_then_its_arguments():
    parser = _parser()
    assert parser.feed('<tool_call>{"name": "get_weather", "argu') == []
    assert parser.feed('ments": {"city"') == [
        ToolCallFragment(0, "call_0", "get_weather", ""),
        ToolCallFragment(0, arguments='{"city"'),
    ]
    assert parser.feed(': "Paris"}}</tool_call>') == [
        ToolCallFragment(0, arguments=': "Paris"}')
    ]
    assert (parser.calls, parser.completed, parser.open_call) == (1, 1, False)
    assert parser.flush() == []


def test_content_before_a_call_is_content_and_a_parameterless_call_gets_braces():
    parsed = whole(f"Let me check.\n{block('f', '{}')}")
    assert parsed.content == "Let me check.\n"
    assert parsed.calls == (("call_0", "f", "{}"),)


def test_arguments_keep_the_models_own_whitespace():
    arguments = '{\n  "a" : [1, 2 ],"b":{ }\n}'
    assert whole(block("f", arguments)).calls == (("call_0", "f", arguments),)


def test_a_close_tag_inside_a_json_string_does_not_end_the_call():
    arguments = '{"q": "</tool_call> and \\" </tool_call>", "r": "\\\\"}'
    text = block("f", arguments) + "\n"
    for pieces in every_split(text):
        assert parse(pieces).calls == (("call_0", "f", arguments),)


def test_parallel_calls_drop_the_whitespace_between_blocks():
    second = block("get_weather", '{"x": 1}')
    text = "\n" + block("f", "{}") + "\n \n" + second + "\n"
    parsed = whole(text)
    assert parsed.content == ""
    assert [c[1:] for c in parsed.calls] == [("f", "{}"), ("get_weather", '{"x": 1}')]


def test_text_after_the_last_block_is_content_unless_whitespace():
    assert whole(block("f", "{}") + "\n\nDone.").content == "\n\nDone."
    assert whole(block("f", "{}") + "\n<tool").content == "\n<tool"
    assert whole(block("f", "{}") + "\n<tool_cal").content == "\n<tool_cal"
    assert whole(block("f", "{}") + " \n").content == ""


def test_a_possible_open_tag_is_held_until_ruled_out():
    parser = _parser()
    assert parser.feed("a <tool") == ["a "]
    assert parser.feed("box>") == ["<toolbox>"]
    assert parser.feed("<") == []
    assert parser.flush() == ["<"]


def test_whitespace_at_the_start_is_held_and_is_content_without_calls():
    parser = _parser()
    assert parser.feed("\n ") == []
    assert parser.feed(" \n") == []
    assert parser.flush() == ["\n  \n"]
    assert whole("\n ").content == "\n "
    assert whole("\nHi").content == "\nHi"


def test_without_markup_content_passes_through_piece_by_piece():
    parser = _parser()
    assert parser.feed("Hello") == ["Hello"]
    assert parser.feed("") == []
    assert parser.feed(" world") == [" world"]
    assert parser.flush() == []


def test_an_unknown_tool_is_content_tag_and_all():
    text = block("delete_everything", "{}")
    assert whole(text) == Parsed(text, (), (text,))


@pytest.mark.parametrize(
    "head",
    [
        "[",
        '{"arguments": {}}',
        '{"name" "f"}',
        '{"name": f}',
        '{"name": "f" "arguments"}',
        '{"name": "f", "arguments": []}',
        '{"name": "a\x01b", "arguments": {}}',
    ],
)
def test_a_head_out_of_format_is_content(head: str):
    text = f"{OPEN_TAG}{head}{CLOSE_TAG}"
    for pieces in every_split(text):
        assert parse(pieces).content == text
        assert parse(pieces).calls == ()


def test_a_second_open_tag_after_a_bad_head_can_still_call():
    text = f"{OPEN_TAG}oops {block('f', '{}')}"
    parsed = whole(text)
    assert parsed.content == f"{OPEN_TAG}oops "
    assert parsed.calls == (("call_0", "f", "{}"),)


def test_a_head_longer_than_the_limit_is_not_a_call():
    padded = OPEN_TAG + "{" + " " * MAX_HEAD_CHARS + '"name": "f", "arguments": {}}'
    for pieces in ([padded], [padded[:600], padded[600:]]):
        assert parse(pieces).calls == ()
        assert parse(pieces).content == padded
    assert whole(OPEN_TAG + "{" + " " * (MAX_HEAD_CHARS + 5)).calls == ()


def test_a_head_the_text_cut_short_is_dropped():
    assert whole('Hmm <tool_call>{"name": "get_wea').content == "Hmm "
    assert whole('<tool_call>{"name": "get_wea').content == ""


def test_a_turn_of_calls_only_drops_what_it_holds_at_the_end():
    for text in ("<tool_", "  ", " <tool_call"):
        free, forced = ToolCallParser(["f"]), ToolCallParser(["f"], calls_only=True)
        assert free.feed(text) == forced.feed(text) == []
        assert forced.flush() == []
        assert free.flush() == [text]  # text, in a turn that may have text


def test_max_tokens_cutting_the_arguments_leaves_an_open_call():
    parser = _parser()
    parts = parser.feed('<tool_call>{"name": "f", "arguments": {"a": "x\\')
    parts += parser.feed("")
    parts += parser.flush()
    assert joined(parts).calls == (("call_0", "f", '{"a": "x\\'),)
    assert (parser.calls, parser.completed, parser.open_call) == (1, 0, True)


def test_an_escape_split_across_pieces_stays_inside_the_string():
    arguments = '{"a": "\\"}"}'
    assert parse([block("f", arguments)[:-17], block("f", arguments)[-17:]]).calls == (
        ("call_0", "f", arguments),
    )


def test_a_close_tag_outside_a_string_ends_broken_arguments():
    text = '<tool_call>{"name": "f", "arguments": {"a": 1</tool_call>after'
    for pieces in every_split(text):
        parsed = parse(pieces)
        assert parsed.calls == (("call_0", "f", '{"a": 1'),)
        assert parsed.content == "after"


def test_an_open_tag_outside_a_string_starts_the_next_block():
    text = (
        '<tool_call>{"name": "f", "arguments": {"a": <tool_call>'
        '{"name": "f", "arguments": {}} "x": "<tool_call>" <tool_call>'
        '{"name": "f", "arguments": {"b": 2}}'
    )
    for pieces in every_split(text):
        assert [c[2] for c in parse(pieces).calls] == ['{"a": ', "{}", '{"b": 2}']


def test_junk_after_the_arguments_is_dropped_up_to_the_close_tag():
    text = (
        '<tool_call>{"name": "f", "arguments": {"a": 1}, "x": "</tool_call>", '
        "< }</tool_call>Done"
    )
    for pieces in every_split(text):
        parsed = parse(pieces)
        assert parsed.calls == (("call_0", "f", '{"a": 1}'),)
        assert parsed.content == "Done"


def test_a_held_close_tag_prefix_is_read_again():
    parser = _parser()
    parser.feed('<tool_call>{"name": "f", "arguments": {"a": 1 </tool')
    assert parser.feed("x, 2}}") == [ToolCallFragment(0, arguments="</toolx, 2}")]
    assert parser.flush() == []


def test_max_calls_drops_the_text_after_the_last_allowed_call():
    text = block("f", "{}") + block("f", '{"b": 1}') + "tail"
    assert whole(text, max_calls=1).calls == (("call_0", "f", "{}"),)
    assert whole(text, max_calls=1).content == ""
    assert len(whole(text, max_calls=2).calls) == 2


def test_feed_after_flush_and_a_second_flush_raise():
    parser = _parser()
    parser.flush()
    with pytest.raises(LocalProtocolError):
        parser.feed("x")
    with pytest.raises(LocalProtocolError):
        parser.flush()


def test_call_ids_are_call_and_24_hex_digits_and_fresh():
    first, second = new_call_id(), new_call_id()
    assert first != second
    assert first.startswith("call_")
    assert len(first) == 29
    int(first[5:], 16)
    assert whole(block("f", "{}")).calls[0][0].startswith("call_")
    assert ToolCallParser(["f"]).feed(block("f", "{}"))[0].id.startswith("call_")  # type: ignore[union-attr]


# -- properties -------------------------------------------------------------

_json_strings = st.lists(
    st.sampled_from(
        ['"', "\\", "}", "{", "]", "[", "<", CLOSE_TAG, OPEN_TAG, "é", "\n", "a", " "]
    )
    | st.text(max_size=3),
    max_size=6,
).map("".join)
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | _json_strings,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(_json_strings, inner, max_size=3)
    ),
    max_leaves=8,
)
_arguments = st.builds(
    lambda obj, indent, separators, ascii: json.dumps(
        obj, indent=indent, separators=separators, ensure_ascii=ascii
    ),
    st.dictionaries(_json_strings, _json_values, max_size=4),
    st.sampled_from([None, 0, 2]),
    st.sampled_from([(", ", ": "), (",", ":"), (" ,", " : ")]),
    st.booleans(),
)
_whitespace = st.text(alphabet=" \n\t", max_size=3)
_text = st.lists(
    st.sampled_from(["<", "<tool", "<tool_call", "</tool_call>", ">", " ", "\n", "a"])
    | st.text(max_size=4),
    max_size=6,
).map("".join)


@st.composite
def turns(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, str]]]:
    """``(text, expected content, expected calls)`` of a well-formed turn."""
    before = draw(_text.filter(lambda t: OPEN_TAG not in t))
    calls = draw(st.lists(st.tuples(st.sampled_from(NAMES), _arguments), max_size=3))
    after = draw(_text.filter(lambda t: OPEN_TAG not in t)) if calls else ""
    text, gap = before, ""
    for name, arguments in calls:
        pad = draw(st.sampled_from(["", " ", "\n  "]))
        text += (
            f'{gap}{OPEN_TAG}{pad}{{{pad}"name"{pad}:{pad}"{name}",{pad}"arguments":'
            f"{pad}{arguments}{pad}}}{pad}{CLOSE_TAG}"
        )
        gap = draw(_whitespace)
    text += gap + after
    content = before
    if calls and not before.strip(" \t\n\r"):
        content = ""
    if after.strip(" \t\n\r"):
        content += gap + after
    return text, content, calls


@given(turns())
def test_a_well_formed_turn_parses_to_its_content_and_calls(turn):
    text, content, calls = turn
    parsed = whole(text)
    assert parsed.content == content
    assert [(name, arguments) for _, name, arguments in parsed.calls] == calls
    assert OPEN_TAG not in parsed.content or OPEN_TAG in content


@given(st.data())
def test_any_split_gives_the_parts_of_one_feed(data):
    text, _, _ = data.draw(turns())
    pieces = data.draw(partitions(text))
    one = whole(text)
    streamed = parse(pieces)
    assert (streamed.content, streamed.calls) == (one.content, one.calls)


@given(st.data())
def test_any_split_of_any_text_gives_the_same_parts(data):
    pieces_of_text = [OPEN_TAG, CLOSE_TAG, "<", '{"name": "f", "arguments": ']
    alphabet = st.sampled_from(
        [*pieces_of_text, "{", "}", '"', "\\", " ", "\n", "x", '"f"', ":", ","]
    )
    text = "".join(data.draw(st.lists(alphabet, max_size=12)))
    pieces = data.draw(partitions(text))
    one, streamed = whole(text), parse(pieces)
    assert (streamed.content, streamed.calls) == (one.content, one.calls)
