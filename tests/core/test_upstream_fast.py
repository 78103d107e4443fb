"""The upstream reader's plain-delta templates against the full parse.

A reader fed each event without its last byte, then that byte, never reads an
event in the fast path, so its items all come from the SSE decoder and a full
JSON parse of every chunk; a
reader fed whole events learns a ``DeltaTemplate`` from the first plain delta
and reads later ones from their bytes. Both must give the same items for any
chunk, encoded any way (compact, ASCII-escaped, with blanks, padded), and any
text, escapes and all.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.events import Usage
from sluicegate.core.upstream.fast import (
    MAX_LEARNS,
    DeltaTemplate,
    _object_end,
    plain_event,
)
from sluicegate.core.upstream.items import UpstreamDelta, UpstreamItem
from sluicegate.core.upstream.limits import (
    NO_USAGE_BOUNDS,
    READER_LIMITS,
    UsageBounds,
)
from sluicegate.core.upstream.reader import UpstreamReader
from sluicegate.core.wire.chunks import Endpoint

from .strategies import tricky_text

CHAT = Endpoint.CHAT
COMPLETION = Endpoint.COMPLETION
PAD = "AZaz09-_"


def event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def chat(text: Any, **fields: Any) -> dict[str, Any]:
    """A chat chunk: ``fields`` named ``choice_*`` go on the choice, ``delta_*``
    on the delta, the rest on the chunk."""
    delta = {"content": text}
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    chunk: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk"}
    for name, value in fields.items():
        if name.startswith("choice_"):
            choice[name.removeprefix("choice_")] = value
        elif name.startswith("delta_"):
            delta[name.removeprefix("delta_")] = value
        else:
            chunk[name] = value
    chunk["choices"] = [choice]
    if "usage_last" in chunk:  # after the choices, as continuous usage comes
        chunk["usage"] = chunk.pop("usage_last")
    if "obfuscation" in chunk:
        chunk["obfuscation"] = chunk.pop("obfuscation")  # last
    return chunk


def slow(
    endpoint: Endpoint, body: bytes, bounds: UsageBounds = NO_USAGE_BOUNDS
) -> list[UpstreamItem]:
    """The items of ``body`` fed so that no event is read by the fast path: each
    event without its last byte (the decoder then holds it, so the reader does
    not stand between two events), then that byte."""
    reader = UpstreamReader(endpoint, usage_bounds=bounds)
    items: list[UpstreamItem] = []
    for one in body.split(b"\n\n")[:-1]:
        items += reader.feed(one + b"\n")
        items += reader.feed(b"\n")
    return items + reader.flush()


def fast(
    endpoint: Endpoint, events: list[bytes], bounds: UsageBounds = NO_USAGE_BOUNDS
) -> tuple[list[UpstreamItem], Any]:
    reader = UpstreamReader(endpoint, usage_bounds=bounds)
    items: list[UpstreamItem] = []
    for one in events:
        items += reader.feed(one)
    return items + reader.flush(), reader


def test_plain_deltas_after_the_first_are_read_from_their_bytes() -> None:
    events = [event(orjson.dumps(chat(t, usage=None))) for t in ("Hel", "lo", '"\\')]
    items, reader = fast(CHAT, events)
    assert items[:3] == [
        UpstreamDelta(0, "Hel"),
        UpstreamDelta(0, "lo"),
        UpstreamDelta(0, '"\\'),
    ]
    assert reader._template is not None
    assert reader._learns == 1
    assert items == slow(CHAT, b"".join(events))


def test_a_padded_delta_is_read_whatever_its_pad() -> None:
    line = orjson.dumps(chat("a", obfuscation="xyz"))
    template = DeltaTemplate.learn(line, orjson.loads(line), CHAT)
    assert template is not None
    other = orjson.dumps(chat('b\n"', obfuscation="0123456789-_"))
    assert template.text(other) == 'b\n"'
    assert template.text(orjson.dumps(chat("b", obfuscation="no pad"))) is None
    assert template.text(orjson.dumps(chat("b", obfuscation=1))) is None
    assert template.text(orjson.dumps(chat("b"))) is None
    assert template.text(orjson.dumps(chat("b", obfuscation="x", id="c2"))) is None
    longer = orjson.dumps(chat("b", obfuscation="x"))
    longer = longer.replace(b',"obfuscation"', b',"usage":null,"obfuscation"')
    assert template.text(longer) is None


def test_a_template_reads_nothing_but_its_own_shape() -> None:
    line = orjson.dumps(chat("a"))
    template = DeltaTemplate.learn(line, orjson.loads(line), CHAT)
    assert template is not None
    assert template.text(line) == "a"
    assert template.text(orjson.dumps(chat("\u00e9\U0001f600\x00"))) == (
        "\u00e9\U0001f600\x00"
    )
    for other in (
        orjson.dumps(chat("a", choice_finish_reason="stop")),
        orjson.dumps(chat("a", id="c2")),
        line[:-1],  # no tail
        line[: line.index(b'"a"') + 1] + b"}}]}",  # the head and tail overlap
        line.replace(b'"a"', b'"a\\"'),  # a string that does not end
        line.replace(b'"a"', b'"a","x":"b"'),  # a quote in the body
        line.replace(b'"a"', b'"\x01"'),  # a raw control character
        line.replace(b'"a"', b'"\\q"'),  # not an escape
    ):
        assert template.text(other) is None


@pytest.mark.parametrize(
    "chunk",
    [
        {"error": {"message": "x"}, "choices": [{"delta": {"content": "a"}}]},
        {"object": "error", "choices": [{"delta": {"content": "a"}}]},
        chat("a", usage={"prompt_tokens": 1}),
        {"choices": {}},
        {"choices": []},
        {"choices": [1]},
        {"choices": [{"delta": {"content": "a"}}, {"delta": {"content": "b"}}]},
        chat("a", choice_index=1),
        chat("a", choice_logprobs={"content": []}),
        chat("a", choice_finish_reason="stop"),
        {"choices": [{"delta": "a"}]},
        chat("a", delta_tool_calls=[{"index": 0}]),
        chat("a", delta_reasoning_content="r"),
        chat("a", delta_reasoning="r"),
        chat(None),
        chat(1),
        {"choices": [{"delta": {"content": "a"}, "x": {"content": "b"}}]},
    ],
)
def test_only_a_plain_delta_is_learned(chunk: dict[str, Any]) -> None:
    line = orjson.dumps(chunk)
    assert DeltaTemplate.learn(line, orjson.loads(line), CHAT) is None


def test_a_lookalike_key_is_not_taken_for_the_text() -> None:
    # The real text has a blank after its colon, so the only '"content":"' is
    # inside another key: the probe parse shows that the text did not move.
    line = b'{"x\\"content":"a","choices":[{"delta":{"content": "a"}}]}'
    assert DeltaTemplate.learn(line, orjson.loads(line), CHAT) is None
    # A text whose string never ends cannot be probed.
    assert DeltaTemplate.learn(b'"content":"a', {"choices": []}, CHAT) is None
    bad = b'{"choices":[{"delta":{"content":"a\\"}}]}'
    assert DeltaTemplate.learn(bad, chat("a"), CHAT) is None


def test_completions_take_the_text_field() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "text": "a", "logprobs": None}]}
    line = orjson.dumps(chunk)
    template = DeltaTemplate.learn(line, chunk, COMPLETION)
    assert template is not None
    assert template.text(line.replace(b'"a"', b'"\\u00e9"')) == "\u00e9"
    no_text = {"choices": [{"index": 0}]}
    assert DeltaTemplate.learn(orjson.dumps(no_text), no_text, COMPLETION) is None


def test_cumulative_text_is_read_as_the_full_parse_reads_it() -> None:
    texts = ["a", "ab", "abc", "abc", "abcd", ""]
    events = [event(orjson.dumps(chat(t))) for t in texts]
    items, reader = fast(CHAT, events)
    assert reader._template is not None
    assert "".join(i.text for i in items if isinstance(i, UpstreamDelta)) == "abcd"
    assert items == slow(CHAT, b"".join(events))


def usage(completion: int) -> dict[str, Any]:
    return {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5}


@pytest.mark.parametrize("pad", [None, "p4d"])
def test_continuous_usage_is_read_with_the_text(pad: str | None) -> None:
    extra = {} if pad is None else {"obfuscation": pad}
    events = [
        event(orjson.dumps(chat(t, usage_last=usage(n), **extra)))
        for n, t in enumerate(["a", "b", 'c"', "d"], 1)
    ]
    items, reader = fast(CHAT, events)
    assert reader._learns == 1
    first = [Usage(5, 1), UpstreamDelta(0, "a"), Usage(5, 2), UpstreamDelta(0, "b")]
    assert items[:4] == first
    assert items == slow(CHAT, b"".join(events))


def test_a_usage_template_reads_only_an_object_where_the_usage_was() -> None:
    line = orjson.dumps(chat("a", usage_last=usage(1)))
    template = DeltaTemplate.learn(line, orjson.loads(line), CHAT)
    assert template is not None
    assert template.read(line) == ("a", usage(1))
    assert template.text(line) is None  # it has a usage
    assert template.read(line.replace(b'"usage":{', b'"usagE":{')) is None
    assert template.read(line.replace(b'"completion_tokens":1', b'"c":1,}')) is None
    other = line[: line.index(b'"usage":') + 8] + b"[1]}"
    assert template.read(other) is None  # not an object
    # A usage before the text, or two usage keys after it: nothing is learned.
    for bad in (
        orjson.dumps(chat("a", usage=usage(1))),  # the usage before the text
        line.replace(b'"usage":{', b'"usage":{"usage":1,'),
    ):
        assert DeltaTemplate.learn(bad, orjson.loads(bad), CHAT) is None


def test_object_end_skips_strings_and_stops_at_the_end() -> None:
    assert _object_end(b'x{"a\\"}":{"b":1}}y', 1) == 17
    assert _object_end(b"x1", 1) == 1
    assert _object_end(b'x{"a":{', 1) == 7


def test_a_reader_stops_learning_after_its_limit() -> None:
    # An upstream with a new id per chunk: every event is learned anew, until
    # the limit; the items are the same either way.
    events = [event(orjson.dumps(chat("t", id=str(i)))) for i in range(40)]
    items, reader = fast(CHAT, events)
    assert reader._learns == MAX_LEARNS
    assert items == slow(CHAT, b"".join(events))


def test_plain_event_leaves_what_is_not_one_data_line() -> None:
    for data in (b"data: x\n", b": c\n\n", b"data: \n\n", b"data: a\rb\n\n"):
        assert plain_event(data, 0, READER_LIMITS) == (b"", 0)
    assert plain_event(b"data: x\n\ndata: y\n\n", 0, READER_LIMITS) == (b"x", 9)


# Text that the encoders escape differently: quotes, backslashes, control
# characters, slashes, non-ASCII, and what looks like the chunk's own keys.
texts = st.one_of(
    tricky_text,
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    st.lists(
        st.sampled_from(
            ['"', "\\", "/", "\x00", "\x1f", "\u2028", "é", "😀", '"content":"', "}"]
        ),
        max_size=6,
    ).map("".join),
)


def _encode(chunk: dict[str, Any], how: str) -> bytes:
    if how == "compact":
        return orjson.dumps(chunk)
    if how == "ascii":
        return json.dumps(chunk, separators=(",", ":")).encode()
    return json.dumps(chunk, ensure_ascii=False).encode()  # with blanks


@st.composite
def chunks(draw: st.DrawFn) -> dict[str, Any]:
    """Mostly plain deltas, sometimes with what makes a chunk not plain."""
    fields: dict[str, Any] = {}
    extras = {
        "usage": st.sampled_from([None, {"prompt_tokens": 1, "completion_tokens": 2}]),
        "choice_finish_reason": st.sampled_from([None, "", "stop", "length"]),
        "choice_logprobs": st.none(),
        "choice_index": st.sampled_from([0, 1, -1, "0"]),
        "delta_role": st.just("assistant"),
        "delta_reasoning_content": st.sampled_from([None, "", "r"]),
        "delta_tool_calls": st.sampled_from([None, []]),
        "id": st.sampled_from(["c1", "c2", 'c"content":"']),
        "obfuscation": st.text(alphabet=PAD, max_size=6),
        "usage_last": st.builds(usage, st.integers(0, 10**6)),
    }
    for name in draw(st.lists(st.sampled_from(sorted(extras)), max_size=3)):
        fields[name] = draw(extras[name])
    text = draw(st.one_of(texts, st.sampled_from([None, 3])))
    return chat(text, **fields)


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(chunks(), st.sampled_from(["compact", "ascii", "blanks"])),
        max_size=8,
    ),
    st.booleans(),
    st.sampled_from([None, 1, 2, 3, 10**9]),
)
def test_any_events_give_what_the_full_parse_gives(
    drawn: list[tuple[dict[str, Any], str]], done: bool, max_tokens: int | None
) -> None:
    # A max_tokens that cuts a choice after a few chunks, or never.
    events = [event(_encode(chunk, how)) for chunk, how in drawn]
    if done:
        events.append(b"data: [DONE]\n\n")
    bounds = UsageBounds(max_tokens)
    items, _ = fast(CHAT, events, bounds)
    assert items == slow(CHAT, b"".join(events), bounds)


@given(st.lists(texts, min_size=1, max_size=6), st.text(alphabet=PAD, max_size=4))
def test_any_text_in_a_learned_shape_is_read_as_parsed(
    later: list[str], pad: str
) -> None:
    first = orjson.dumps(chat("a", obfuscation=pad))
    template = DeltaTemplate.learn(first, orjson.loads(first), CHAT)
    assert template is not None
    for text in later:
        for how in ("compact", "ascii"):
            line = _encode(chat(text, obfuscation=pad + "x"), how)
            assert (
                template.text(line)
                == orjson.loads(line)["choices"][0]["delta"]["content"]
            )


@given(texts, st.binary(max_size=8))
def test_any_bytes_in_the_text_are_read_as_parsed_or_left(
    text: str, junk: bytes
) -> None:
    # Raw bytes where the text goes: escapes that orjson takes or refuses,
    # quotes and backslashes that end or break the string.
    first = orjson.dumps(chat(text))
    template = DeltaTemplate.learn(first, orjson.loads(first), CHAT)
    assert template is not None
    head = first[: first.index(b'"content":"') + 11]
    line = head + junk + first[len(head) + len(orjson.dumps(text)) - 2 :]
    got = template.text(line)
    try:
        expected = orjson.loads(line)["choices"][0]["delta"]["content"]
    except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
        assert got is None
        return
    assert got in (None, expected)
    items, _ = fast(CHAT, [event(first), event(line)])
    assert items == slow(CHAT, event(first) + event(line))
