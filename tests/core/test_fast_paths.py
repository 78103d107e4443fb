"""The per-token fast paths give the same bytes and text as the plain ones.

``StreamMachine`` builds a content frame from prebuilt bytes around the JSON of
the text; these tests rebuild every frame the straightforward way (the full chunk
dict from ``chunks``, ``dumps``, ``encode_event``) and compare bytes. The
detokenizer's ASCII path, the stop matcher's no-stop-can-start path and the
decoder's one-token path are checked against their general paths.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
    dumps,
    usage_chunk,
)
from sluicegate.core.detokenize import IncrementalDetokenizer
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.sse import DONE, SSEDecoder, encode_event
from sluicegate.core.stops import StopMatcher
from sluicegate.core.stream import StreamMachine
from tests.core.strategies import tricky_text

# Text a JSON encoder must escape or keep: quotes, backslashes, control
# characters, line and paragraph separators, emoji; and the marker the machine
# splits its frames on.
wire_text = st.one_of(
    tricky_text,
    st.text(st.characters(exclude_categories=["Cs"]), max_size=20),
    st.lists(
        st.sampled_from(
            [
                *['"', "\\", "\\u", "\x00", "\x1f", "\x7f", "\u2028", "\u2029"],
                *["👩\u200d💻", "é", "\x00sluicegate:text\x00", "content", "null", "}"],
            ]
        ),
        max_size=12,
    ).map("".join),
)

headers = st.builds(
    ResponseHeader,
    id=wire_text,
    created=st.integers(0, 2**40),
    model=wire_text,
    endpoint=st.sampled_from(Endpoint),
    n=st.integers(1, 4),
    include_usage=st.booleans(),
    system_fingerprint=st.none() | wire_text,
)


def reference_frames(
    header: ResponseHeader, event: Delta | Finish | End
) -> list[bytes]:
    """What the machine must write, built from whole chunk dicts."""
    chat = header.endpoint is Endpoint.CHAT
    payload: dict[str, Any]
    match event:
        case Delta(index=index, text=text):
            if not text:
                return []
            if chat:
                payload = chat_chunk(header, index, {"content": text})
            else:
                payload = completion_chunk(header, index, text)
        case Finish(index=index, finish_reason=reason):
            if chat:
                payload = chat_chunk(header, index, {}, reason)
            else:
                payload = completion_chunk(header, index, "", reason)
        case End(usage=usage):
            if not header.include_usage:
                return [DONE]
            return [encode_event(dumps(usage_chunk(header, usage))), DONE]
    return [encode_event(dumps(payload))]


@st.composite
def streams(draw: st.DrawFn) -> tuple[ResponseHeader, list[Delta | Finish | End]]:
    """A header and a legal event sequence: deltas, one finish per choice, End."""
    header = draw(headers)
    events: list[Delta | Finish | End] = []
    open_choices = list(range(header.n))
    while open_choices:
        index = draw(st.sampled_from(open_choices))
        if draw(st.integers(0, 4)) == 0:
            events.append(Finish(index, draw(st.sampled_from(FinishReason))))
            open_choices.remove(index)
        else:
            events.append(Delta(index, draw(wire_text)))
    usage = Usage(draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)))
    events.append(End(usage))
    return header, events


@given(streams())
def test_frames_are_byte_identical_to_whole_chunk_encoding(
    stream: tuple[ResponseHeader, list[Delta | Finish | End]],
) -> None:
    header, events = stream
    machine = StreamMachine(header)
    machine.start()
    for event in events:
        assert machine.feed(event) == reference_frames(header, event)


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_marker_in_id_and_model_does_not_move_the_text(endpoint: Endpoint) -> None:
    marker = "\x00sluicegate:text\x00"
    header = ResponseHeader(marker, 1, marker, endpoint, 2, True, marker)
    machine = StreamMachine(header)
    machine.start()
    for index in (1, 0):
        event = Delta(index, f"say {marker}")
        assert machine.feed(event) == reference_frames(header, event)


@pytest.mark.parametrize("endpoint", list(Endpoint))
def test_a_delta_with_usage_is_built_whole_with_its_text(endpoint: Endpoint) -> None:
    header = ResponseHeader("id", 1, "m", endpoint, 1, True)
    machine = StreamMachine(header)
    machine.start()
    for text, frame_count in (("", 0), ('a "b"\n', 1)):
        frames = machine.feed(Delta(0, text, usage=Usage(3, 1)))
        assert len(frames) == frame_count
        for frame in frames:
            (event,) = SSEDecoder().feed(frame)
            choice = orjson.loads(event.data)["choices"][0]
            assert choice.get("text", choice.get("delta", {}).get("content")) == text


def test_a_lone_surrogate_in_a_delta_raises_and_changes_nothing() -> None:
    machine = StreamMachine(ResponseHeader("id", 1, "m", Endpoint.CHAT))
    machine.start()
    with pytest.raises(TypeError):
        machine.feed(Delta(0, "a\ud800"))
    assert machine.feed(Delta(0, "ok")) == reference_frames(
        machine.header, Delta(0, "ok")
    )


# -- detokenizer and decoder ----------------------------------------------------

PIECES = [b"a", b" b", b"\xc3", b"\xa9", b"\xe6\x97", b"\xa5", b"\xed\xa0", b"\xff"]
PIECES += [b"\n", b"<", b"/x>", b"", b"\xf0\x9f", b"\xa4\x96"]
SKIP = frozenset({11})


@given(st.lists(st.integers(0, len(PIECES) - 1), max_size=40))
def test_one_token_steps_give_the_text_of_one_whole_step(ids: list[int]) -> None:
    one_by_one = IncrementalDetokenizer(PIECES, SKIP)
    text = "".join(one_by_one.feed((i,)) for i in ids) + one_by_one.flush()
    whole = IncrementalDetokenizer(PIECES, SKIP)
    assert text == whole.feed(ids) + whole.flush()
    expected = b"".join(PIECES[i] for i in ids if i not in SKIP).decode(
        "utf-8", "replace"
    )
    assert text == expected


def test_ascii_after_a_dead_lead_byte_replaces_it_at_once() -> None:
    detokenizer = IncrementalDetokenizer(PIECES)
    assert detokenizer.feed([2]) == ""  # b"\xc3": may still complete
    assert detokenizer.pending_bytes == b"\xc3"
    assert detokenizer.feed([0]) == "\ufffda"
    assert detokenizer.pending_bytes == b""
    assert detokenizer.feed([0]) == "a"


@given(
    st.lists(st.integers(0, len(PIECES) - 1), max_size=40),
    st.lists(st.integers(1, 3), max_size=20),
)
def test_decoder_steps_of_any_size_agree_with_one_token_steps(
    ids: list[int], sizes: list[int]
) -> None:
    stops = ["</x>", "\n\n"]

    def decode(steps: list[list[int]]) -> tuple[str, FinishReason | None, int]:
        decoder = ChoiceDecoder(
            IncrementalDetokenizer(PIECES, SKIP), StopMatcher(stops)
        )
        text, reason = "", None
        for step in steps:
            result = decoder.feed(step)
            text += result.text
            reason = reason or result.finish_reason
        tail = decoder.flush()
        return text + tail.text, reason or tail.finish_reason, decoder.completion_tokens

    steps, rest = [], list(ids)
    for size in sizes:
        steps.append(rest[:size])
        rest = rest[size:]
    steps.append(rest)
    assert decode(steps) == decode([[i] for i in ids])


def test_a_step_without_text_is_the_shared_empty_step() -> None:
    decoder = ChoiceDecoder(IncrementalDetokenizer(PIECES), StopMatcher(["<x"]))
    assert decoder.feed([2]) == ChoiceStep("")  # half a character
    assert decoder.feed([3]) == ChoiceStep("é")
    assert decoder.feed([9]) == ChoiceStep("")  # "<" held back
    assert decoder.feed([0]) == ChoiceStep("<a")
