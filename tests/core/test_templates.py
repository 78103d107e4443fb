"""Frames from templates against the JSON encoder's frames, for every API.

``EventTemplate`` must give, for any text and sequence number, the bytes that
``EventPadder.event`` (padded) or ``dumps`` (unpadded) gives for the same
payload, and leave the padder as it would (the next heartbeat has the same
size). The Responses and Messages machines, which take their text deltas from
templates, must write deltas that parse to exactly the payload the JSON path
would have encoded, byte for byte once re-encoded. Chat and completions are
checked the same way in ``test_fast_paths.py``; the padding of every templated
frame in ``test_padding.py`` and ``test_event_padding.py``.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Finish,
    FinishReason,
    Heartbeat,
    StreamEvent,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.wire.chunks import MAX_INT, Endpoint, ResponseHeader, dumps
from sluicegate.core.wire.contracts import stream_machine
from sluicegate.core.wire.padding import (
    PAD_FIELD,
    EventPadder,
    Filler,
    FramePadder,
    content_chunk,
    frame_floor,
)
from sluicegate.core.wire.sse import SSEDecoder, encode_event
from sluicegate.core.wire.stream import StreamMachine
from sluicegate.core.wire.templates import (
    NUMBER_MARK,
    TEXT_MARK,
    ChoiceFrames,
    EventTemplate,
)

from .strategies import tricky_text

# Any text JSON can carry: control characters, quotes, backslashes, line and
# paragraph separators, astral characters, the markers themselves.
texts = st.one_of(
    tricky_text,
    st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=24),
    st.lists(
        st.sampled_from(
            ['"', "\\", "\x00", "\x1f", "\x7f", "\u2028", "👩\u200d💻", TEXT_MARK]
        ),
        min_size=1,
        max_size=8,
    ).map("".join),
)


def _payload(text: Any, number: Any, item_id: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "sequence_number": number,
        "item_id": item_id,
        "output_index": 0,
        "content_index": 0,
        "delta": text,
        "logprobs": [],
    }


@given(
    st.lists(st.tuples(texts, st.integers(0, 10**9)), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(0, 2**32)),
    st.sampled_from([16, 64]),
    st.text(max_size=8),
)
def test_an_event_template_gives_the_encoders_bytes(
    deltas: list[tuple[str, int]], seed: int | None, step: int, item_id: str
) -> None:
    kind = "response.output_text.delta"
    mine = None if seed is None else EventPadder(Filler(seed), step)
    theirs = None if seed is None else EventPadder(Filler(seed), step)
    template = EventTemplate(kind, _payload(TEXT_MARK, NUMBER_MARK, item_id), mine)
    for text, number in deltas:
        payload = _payload(text, number, item_id)
        if theirs is None:
            expected = b"event: " + kind.encode() + b"\ndata: " + dumps(payload)
            expected += b"\n\n"
        else:
            expected = theirs.event(kind, payload, text)
        assert template.frame(text, number) == expected
    if mine is not None and theirs is not None:
        assert mine.keep_alive() == theirs.keep_alive()


@given(texts, st.one_of(st.none(), st.integers(0, 2**32)))
def test_an_unnumbered_template_ignores_the_number(text: str, seed: int | None) -> None:
    payload = {"type": "content_block_delta", "index": 3, "delta": {"text": TEXT_MARK}}
    mine = None if seed is None else EventPadder(Filler(seed))
    theirs = None if seed is None else EventPadder(Filler(seed))
    template = EventTemplate("content_block_delta", payload, mine)
    real = {**payload, "delta": {"text": text}}
    if theirs is None:
        expected = b"event: content_block_delta\ndata: " + dumps(real) + b"\n\n"
    else:
        expected = theirs.event("content_block_delta", real, text)
    assert template.frame(text, 99) == expected


names = st.one_of(texts, st.sampled_from(["", "usage", "\x00sluicegate:usage\x00"]))
usage_headers = st.builds(
    ResponseHeader,
    id=names,
    created=st.integers(0, 2**40),
    model=names,
    endpoint=st.sampled_from([Endpoint.CHAT, Endpoint.COMPLETION]),
    n=st.integers(1, 3),
    include_usage=st.booleans(),
    system_fingerprint=st.none() | names,
    continuous_usage=st.booleans(),
    prompt_tokens=st.integers(0, 10**6),
    cached_tokens=st.integers(0, 10**6),
)
counts = st.one_of(
    st.integers(0, 10**7), st.integers(-(2**70), 2**70), st.sampled_from([MAX_INT])
)
usages = st.builds(
    Usage,
    prompt_tokens=counts,
    completion_tokens=counts,
    cached_tokens=st.one_of(st.just(0), counts),
    reasoning_tokens=st.none() | counts,
)


def _in_range(usage: Usage) -> bool:
    values = [usage.prompt_tokens, usage.completion_tokens, usage.total_tokens]
    values += [usage.cached_tokens, usage.reasoning_tokens or 0]
    return all(0 <= value <= MAX_INT for value in values)


@settings(max_examples=150)
@given(
    usage_headers,
    st.lists(st.tuples(texts, usages), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(0, 2**32)),
    st.sampled_from([16, 64]),
)
def test_a_usage_frame_is_the_whole_chunks_bytes(
    header: ResponseHeader,
    deltas: list[tuple[str, Usage]],
    seed: int | None,
    step: int,
) -> None:
    """Continuous usage: the templated content frame of any text and counts is
    the encoder's frame of the whole chunk, padded or not (and leaves the
    filler where the encoder does); counts ``dumps`` would clamp are left to
    the whole build, which the machine then takes."""
    mine = (
        None if seed is None else FramePadder(Filler(seed), frame_floor(header), step)
    )
    theirs = (
        None if seed is None else FramePadder(Filler(seed), frame_floor(header), step)
    )
    frames = ChoiceFrames(header, mine)
    for n, (text, usage) in enumerate(deltas):
        index = n % header.n
        got = frames.usage_frame(index, text, usage)
        if not text:
            assert got == b""
            continue
        if not _in_range(usage):
            assert got is None
            continue
        chunk = content_chunk(header, index, text, usage)
        expected = encode_event(dumps(chunk)) if theirs is None else theirs.frame(chunk)
        assert got == expected
    if mine is not None and theirs is not None:
        assert mine.comment() == theirs.comment()


@settings(max_examples=50)
@given(usage_headers, st.lists(st.tuples(texts, usages), min_size=1, max_size=4))
def test_the_machine_writes_usage_deltas_as_the_whole_build(
    header: ResponseHeader, deltas: list[tuple[str, Usage]]
) -> None:
    machine = StreamMachine(header)
    machine.start()
    for text, usage in deltas:
        chunk = content_chunk(header, 0, text, usage)
        expected = [encode_event(dumps(chunk))] if text else []
        assert machine.feed(Delta(0, text, usage=usage)) == expected


@pytest.mark.parametrize("padder", [None, FramePadder(Filler(1), 300)])
def test_choice_frames_of_empty_text_and_closed_choices(
    padder: FramePadder | None,
) -> None:
    frames = ChoiceFrames(ResponseHeader("c", 1, "m", Endpoint.CHAT, 2), padder)
    assert frames.frame(0, "") == b""
    assert frames.frame(1, "a")
    assert frames.usage_frame(1, "a", Usage(1, 2))
    frames.close(1)
    assert frames.frame(1, "a") is None
    assert frames.frame(1, "") is None
    assert frames.frame(2, "a") is None
    assert frames.usage_frame(1, "a", Usage(1, 2)) is None
    assert frames.usage_frame(2, "", Usage(1, 2)) is None


def test_a_lone_surrogate_fails_as_the_encoder_does() -> None:
    template = EventTemplate("e", {"type": "e", "text": TEXT_MARK}, None)
    with pytest.raises(TypeError):
        template.frame("\ud800")


def _decoded(frames: list[bytes]) -> list[tuple[str, dict[str, Any], bytes]]:
    """Each event's name, its data parsed (pad dropped) and its data's bytes."""
    out = []
    decoder = SSEDecoder()
    for event in decoder.feed(b"".join(frames)):
        data = orjson.loads(event.data)
        data.pop(PAD_FIELD, None)
        out.append((event.event, data, event.data.encode()))
    return out


@st.composite
def deltas(draw: st.DrawFn) -> list[StreamEvent]:
    """Text deltas, with reasoning and tool calls that close and reopen the
    text's item or block between them."""
    events: list[StreamEvent] = []
    for n, text in enumerate(draw(st.lists(texts, min_size=1, max_size=8))):
        match draw(st.integers(0, 5)):
            case 0:
                events.append(Delta(0, "", parts=DeltaParts(reasoning=text)))
            case 1:
                call = ToolCallFragment(n, f"call_{n}", "f", "{}")
                events.append(Delta(0, text, parts=DeltaParts((call,))))
            case 2:
                events.append(Heartbeat())
        events.append(Delta(0, text))
    return [*events, Finish(0, FinishReason.STOP), End(Usage(3, 4))]


@pytest.mark.parametrize("endpoint", [Endpoint.RESPONSES, Endpoint.MESSAGES])
@settings(max_examples=100)
@given(events=deltas(), seed=st.one_of(st.none(), st.integers(0, 2**32)))
def test_text_deltas_parse_to_what_the_encoder_wrote(
    endpoint: Endpoint, events: list[StreamEvent], seed: int | None
) -> None:
    header = ResponseHeader(
        "resp_x" if endpoint is Endpoint.RESPONSES else "msg_x", 1, "m", endpoint
    )
    machine = stream_machine(header, None if seed is None else Filler(seed))
    frames = machine.start()
    for event in events:
        frames += machine.feed(event)
    got = _decoded(frames)
    texts_fed = [e.text for e in events if isinstance(e, Delta) and e.text]
    if endpoint is Endpoint.RESPONSES:
        text_events = [g for g in got if g[0] == "response.output_text.delta"]
        for n, (_, data, raw) in enumerate(text_events):
            assert data == {
                "type": "response.output_text.delta",
                "sequence_number": data["sequence_number"],
                "item_id": data["item_id"],
                "output_index": data["output_index"],
                "content_index": 0,
                "delta": texts_fed[n],
                "logprobs": [],
            }
            if seed is None:
                assert raw == dumps(data)
        numbers = [data["sequence_number"] for _, data, _ in got]
        assert numbers == list(range(len(got)))
        done = [g[1]["text"] for g in got if g[0] == "response.output_text.done"]
        assert "".join(done) == "".join(texts_fed)
    else:
        text_events = [
            g
            for g in got
            if g[0] == "content_block_delta" and g[1]["delta"]["type"] == "text_delta"
        ]
        for n, (_, data, raw) in enumerate(text_events):
            assert data == {
                "type": "content_block_delta",
                "index": data["index"],
                "delta": {"type": "text_delta", "text": texts_fed[n]},
            }
            if seed is None:
                assert raw == dumps(data)
    assert len(text_events) == len(texts_fed)
