from __future__ import annotations

from collections.abc import Sequence

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.errors import LocalProtocolError, RemoteProtocolError
from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.sse import (
    DONE,
    Event,
    SSEDecoder,
    encode_comment,
    encode_event,
)
from sluicegate.core.wire.stream import StreamMachine

from .strategies import every_split, split_at, tricky_text


def decode(parts: Sequence[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    events = [event for part in parts for event in decoder.feed(part)]
    assert decoder.flush() == []
    return events


# --- encode_event / encode_comment ------------------------------------------------


@pytest.mark.parametrize(
    ("data", "frame"),
    [
        ("hello", b"data: hello\n\n"),
        ("", b"data: \n\n"),
        ("a\nb", b"data: a\ndata: b\n\n"),
        ("a\r\nb", b"data: a\ndata: b\n\n"),
        ("a\rb", b"data: a\ndata: b\n\n"),
        ("a\n", b"data: a\ndata: \n\n"),
        ("\n\n", b"data: \ndata: \ndata: \n\n"),
        ("\r\r\n", b"data: \ndata: \ndata: \n\n"),
        (" lead", b"data:  lead\n\n"),
        ("é\u2028\x00", "data: é\u2028\x00\n\n".encode()),
        (b'{"a":1}', b'data: {"a":1}\n\n'),
        (b"x\r\ny", b"data: x\ndata: y\n\n"),
    ],
)
def test_encode_event_writes_one_data_line_per_line(
    data: str | bytes, frame: bytes
) -> None:
    assert encode_event(data) == frame


def test_done_is_the_done_event() -> None:
    assert encode_event("[DONE]") == DONE == b"data: [DONE]\n\n"


def test_encode_event_rejects_a_lone_surrogate() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_event("\ud800")


def test_encode_comment_is_a_heartbeat() -> None:
    assert encode_comment() == b": keep-alive\n\n"
    assert encode_comment("") == b": \n\n"
    assert encode_comment("ping 3") == b": ping 3\n\n"


@pytest.mark.parametrize("text", ["a\nb", "a\r", "\r\n"])
def test_encode_comment_rejects_line_ends(text: str) -> None:
    with pytest.raises(ValueError, match="line end"):
        encode_comment(text)


# --- decoder: the spec's own examples (WHATWG HTML 9.2.5) -------------------------


def test_spec_example_multiline_data_is_joined_with_lf() -> None:
    stream = b"data: YHOO\ndata: +2\ndata: 10\n\n"
    assert decode([stream]) == [Event("YHOO\n+2\n10")]


def test_spec_example_comment_ids_and_leading_space() -> None:
    stream = (
        b": test stream\n\n"
        b"data: first event\nid: 1\n\n"
        b"data:second event\nid\n\n"
        b"data:  third event\n\n"
    )
    decoder = SSEDecoder()
    assert decoder.feed(stream) == [
        Event("first event", id="1"),
        Event("second event", id=""),
        Event(" third event", id=""),
    ]
    assert decoder.comments == 1


def test_spec_example_last_event_without_blank_line_is_not_dispatched() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: first\n\ndata:  third event\n") == [Event("first")]
    assert decoder.pending
    assert decoder.flush() == []
    assert decoder.discarded


def test_spec_example_empty_data_fields() -> None:
    stream = b"data\n\ndata\ndata\n\ndata:"
    decoder = SSEDecoder()
    assert decoder.feed(stream) == [Event(""), Event("\n")]
    assert decoder.flush() == []
    assert decoder.discarded


def test_spec_example_space_after_colon_is_optional() -> None:
    assert decode([b"data:test\n\ndata: test\n\n"]) == [Event("test"), Event("test")]


def test_spec_example_event_types() -> None:
    stream = (
        b"event: add\ndata: 73857293\n\n"
        b"event: remove\ndata: 2153\n\n"
        b"event: add\ndata: 113411\n\n"
    )
    assert decode([stream]) == [
        Event("73857293", event="add"),
        Event("2153", event="remove"),
        Event("113411", event="add"),
    ]


# --- decoder: line ends, BOM, fields ----------------------------------------------


@pytest.mark.parametrize("end", [b"\n", b"\r", b"\r\n"])
def test_each_line_end_ends_a_line(end: bytes) -> None:
    stream = b"data: a" + end + b"data: b" + end + end
    assert decode([stream]) == [Event("a\nb")]


def test_cr_at_chunk_end_and_lf_in_next_chunk_are_one_line_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n") == []
    assert decoder.feed(b"\r") == [Event("a")]
    assert decoder.feed(b"\n") == []
    assert not decoder.pending
    assert decoder.feed(b"data: b\r\n\r\n") == [Event("b")]


def test_cr_at_chunk_end_dispatches_without_waiting_for_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\r") == [Event("a")]
    assert decoder.feed(b"data: b\n\n") == [Event("b")]


def test_lf_after_cr_is_skipped_only_once() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\n") == [Event("a")]


def test_leading_bom_is_dropped_even_when_split() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xef\xbb") == []
    assert decoder.feed(b"\xbf") == []
    assert decoder.feed(b"data: x\n\n") == [Event("x")]


def test_only_one_leading_bom_is_dropped() -> None:
    # A second BOM starts the first line's field name, so the line is ignored.
    assert decode(["\ufeff\ufeffdata: x\n\ndata: y\n\n".encode()]) == [Event("y")]


def test_bom_inside_data_is_kept() -> None:
    assert decode(["data: \ufeffx\n\n".encode()]) == [Event("\ufeffx")]


def test_event_without_data_is_not_dispatched() -> None:
    # Deliberate: httpx-sse and openai would dispatch Event("", event="ping").
    decoder = SSEDecoder()
    assert decoder.feed(b"event: ping\n\n") == []
    assert decoder.feed(b"data: x\n\n") == [Event("x")]


def test_event_type_is_reset_after_each_dispatch() -> None:
    assert decode([b"event: a\ndata: 1\n\ndata: 2\n\n"]) == [
        Event("1", event="a"),
        Event("2"),
    ]


def test_empty_event_field_means_message() -> None:
    assert decode([b"event:\ndata: 1\n\n"]) == [Event("1")]


def test_last_event_id_carries_over_and_nul_ids_are_ignored() -> None:
    assert decode([b"id: 7\ndata: a\n\ndata: b\n\nid: 8\x009\ndata: c\n\n"]) == [
        Event("a", id="7"),
        Event("b", id="7"),
        Event("c", id="7"),
    ]


def test_retry_takes_only_ascii_digits() -> None:
    stream = (
        b"retry: 3000\ndata: a\n\n"
        b"retry: 1.5\ndata: b\n\n"
        b"retry: \xd9\xa3\ndata: c\n\n"
        b"retry:\ndata: d\n\n"
    )
    assert decode([stream]) == [
        Event("a", retry=3000),
        Event("b"),
        Event("c"),
        Event("d"),
    ]


def test_unknown_fields_and_fields_without_colon_are_handled_per_spec() -> None:
    stream = b"foo: bar\nDATA: x\ndata\ndata:: y\n\n"
    assert decode([stream]) == [Event("\n: y")]


def test_comments_are_counted_and_never_dispatched() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b": keep-alive\n\n:\n: a\n") == []
    assert decoder.comments == 3
    assert decoder.feed(encode_comment()) == []
    assert decoder.comments == 4
    assert not decoder.pending


# --- decoder: errors and end of stream ---------------------------------------------


def test_invalid_utf8_raises_and_closes_the_decoder() -> None:
    decoder = SSEDecoder()
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        decoder.feed(b"data: \xff\n\n")
    with pytest.raises(LocalProtocolError):
        decoder.feed(b"data: x\n\n")
    with pytest.raises(LocalProtocolError):
        decoder.flush()


def test_remote_error_has_a_bad_gateway_status_hint() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        SSEDecoder().feed(b"\xc3\x28")
    assert info.value.status_hint == 502


def test_incomplete_character_at_end_of_stream_is_truncation_not_an_error() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: \xe2\x82") == []
    assert decoder.flush() == []
    assert decoder.discarded


def test_incomplete_utf8_alone_is_pending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"\xe2") == []
    assert decoder.pending


@pytest.mark.parametrize(
    ("stream", "pending"),
    [
        (b"", False),
        (b"data: a\n\n", False),
        (b": comment\n", False),
        (b"id: 1\n", False),
        (b"data: a", True),
        (b"data: a\n", True),
        (b"event: x\n", True),
        (b"retry: 5\n", True),
    ],
)
def test_pending_tells_whether_an_event_is_incomplete(
    stream: bytes, pending: bool
) -> None:
    decoder = SSEDecoder()
    decoder.feed(stream)
    assert decoder.pending is pending
    decoder.flush()
    assert decoder.discarded is pending


def test_flush_twice_and_feed_after_flush_raise() -> None:
    decoder = SSEDecoder()
    assert decoder.flush() == []
    assert not decoder.discarded
    with pytest.raises(LocalProtocolError):
        decoder.flush()
    with pytest.raises(LocalProtocolError):
        decoder.feed(b"data: x\n\n")


# --- decoder: any split -------------------------------------------------------------

OPENAI_STREAM = (
    "\ufeff: keep-alive\r\n\r\n"
    'data: {"choices":[{"delta":{"content":"Café €"}}]}\r\n\r\n'
    "event: x\rdata: two\rdata: lines\r\r"
    ": c\n"
    'data: {"choices":[],"usage":{"total_tokens":3}}\n\n'
    "data: [DONE]\n\n"
).encode()
OPENAI_EVENTS = [
    Event('{"choices":[{"delta":{"content":"Café €"}}]}'),
    Event("two\nlines", event="x"),
    Event('{"choices":[],"usage":{"total_tokens":3}}'),
    Event("[DONE]"),
]


@pytest.mark.parametrize("parts", every_split(OPENAI_STREAM))
def test_every_split_of_a_stream_gives_the_same_events(parts: list[bytes]) -> None:
    decoder = SSEDecoder()
    events = [event for part in parts for event in decoder.feed(part)]
    assert events == OPENAI_EVENTS
    assert decoder.comments == 2
    assert not decoder.pending


@settings(max_examples=300)
@given(texts=st.lists(tricky_text, max_size=5), data=st.data())
def test_decode_of_encode_is_identity_for_any_split(
    texts: list[str], data: st.DataObject
) -> None:
    stream = b"".join(encode_event(text) for text in texts)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=10))
    events = decode(split_at(stream, cuts))
    # CR and CRLF come back as LF: the event-stream grammar cannot carry them.
    expected = [text.replace("\r\n", "\n").replace("\r", "\n") for text in texts]
    assert [event.data for event in events] == expected


@settings(max_examples=300)
@given(text=tricky_text)
def test_json_payload_round_trips_exactly(text: str) -> None:
    frame = encode_event(orjson.dumps({"content": text}))
    assert frame.count(b"\n") == 2
    (event,) = decode([frame])
    assert orjson.loads(event.data) == {"content": text}


@settings(max_examples=200)
@given(stream=st.binary(max_size=60), data=st.data())
def test_any_bytes_in_any_split_decode_alike(
    stream: bytes, data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=8))

    def outcome(parts: Sequence[bytes]) -> object:
        try:
            return decode(parts)
        except RemoteProtocolError:
            return "error"

    assert outcome(split_at(stream, cuts)) == outcome([stream])


# --- model text can never forge a frame ----------------------------------------

S16_TEXT = "line one\n\ndata: [DONE]\n\nline\rtwo\u2028three\x00four"


def test_s16_model_text_that_looks_like_frames_comes_back_in_one_delta() -> None:
    header = ResponseHeader("chatcmpl-s16", 1, "m", Endpoint.CHAT)
    machine = StreamMachine(header)
    frames = machine.start() + machine.feed(Delta(0, S16_TEXT))
    frames += machine.feed(Finish(0, FinishReason.STOP))
    frames += machine.feed(End(Usage(3, 4)))
    stream = b"".join(frames)
    for split in every_split(stream):
        events = decode(split)
        assert [event.data for event in events].index("[DONE]") == len(events) - 1
        chunks = [orjson.loads(event.data) for event in events[:-1]]
        deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
        assert deltas == [{"role": "assistant"}, {"content": S16_TEXT}, {}]
