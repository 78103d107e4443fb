"""Padded streams: every frame's size is a ladder step, whatever its text says."""

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
    Fail,
    Finish,
    FinishReason,
    Heartbeat,
    StreamEvent,
    Usage,
)
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.wire.chunks import Endpoint, ResponseHeader
from sluicegate.core.wire.padding import (
    FILL_ALPHABET,
    MIN_STEP_BYTES,
    PAD_FIELD,
    Filler,
    content_chunk,
    frame_floor,
    split_padded_frame,
    step_bytes,
)
from sluicegate.core.wire.sse import DONE, SSEDecoder
from sluicegate.core.wire.stream import StreamMachine
from tests.core.test_fast_paths import wire_text

STOP = FinishReason.STOP


def _header(
    endpoint: Endpoint = Endpoint.CHAT,
    n: int = 1,
    include_usage: bool = True,
    continuous_usage: bool = False,
) -> ResponseHeader:
    return ResponseHeader(
        "chatcmpl-7", 1700000000, "default", endpoint, n, include_usage,
        continuous_usage=continuous_usage, prompt_tokens=9,
    )  # fmt: skip


def _stream(
    header: ResponseHeader, events: list[StreamEvent], seed: int | None = 1
) -> list[bytes]:
    machine = StreamMachine(header, None if seed is None else Filler(seed))
    frames = machine.start()
    for event in events:
        frames += machine.feed(event)
    return frames


def _unpadded(frame: bytes) -> Any:
    if frame.startswith(b":"):
        return ":"
    body = frame[len(b"data: ") : -2]
    if body == b"[DONE]":
        return "[DONE]"
    payload = orjson.loads(body)
    pad = payload.pop(PAD_FIELD)
    assert set(pad.encode()) <= set(FILL_ALPHABET)
    return payload


def test_the_ladder_is_one_step_up_to_16_bytes_then_powers_of_two() -> None:
    assert [step_bytes(e) for e in (-40, 0, 1, 16)] == [MIN_STEP_BYTES] * 4
    assert [step_bytes(e) for e in (17, 32, 33, 100, 1000)] == [32, 32, 64, 128, 1024]


def test_a_filler_gives_pad_characters_repeatably_from_its_seed() -> None:
    a, b = Filler(7), Filler(7)
    # refills as the pool grows, takes past the pool's size, and past its largest
    sizes = [0, 1, 15, 300, 200, 4000, 200, 5000, 3, *[97] * 200]
    taken = [a.take(n) for n in sizes]
    assert taken == [b.take(n) for n in sizes]
    assert [len(t) for t in taken] == sizes
    assert set(b"".join(taken)) <= set(FILL_ALPHABET)
    assert Filler(8).take(64) != Filler(7).take(64)


@pytest.mark.parametrize("endpoint", list(Endpoint))
@pytest.mark.parametrize("include_usage", [False, True])
def test_every_frame_of_short_tokens_has_one_size(
    endpoint: Endpoint, include_usage: bool
) -> None:
    header = _header(endpoint, include_usage=include_usage)
    texts = ["a", "hello world!", "é", '"\n', "x" * 16, "👩\u200d💻"]
    events: list[StreamEvent] = [Delta(0, t) for t in texts]
    events += [Heartbeat(), Finish(0, FinishReason.LENGTH), End(Usage(9, 12345))]
    frames = _stream(header, events)
    assert frames[-1] == DONE
    assert len({len(f) for f in frames[:-1]}) == 1
    assert len(frames[0]) == frame_floor(header) + MIN_STEP_BYTES
    # Without their pad, the frames are the unpadded stream's.
    plain = _stream(header, events, seed=None)
    assert [_unpadded(f) for f in frames] == [_unpadded_plain(f) for f in plain]


def _unpadded_plain(frame: bytes) -> Any:
    if frame.startswith(b":"):
        return ":"
    body = frame[len(b"data: ") : -2]
    return "[DONE]" if body == b"[DONE]" else orjson.loads(body)


def test_longer_text_moves_up_one_step_and_decodes() -> None:
    header = _header()
    frames = _stream(header, [Delta(0, "x" * 17), Delta(0, "y" * 40)])
    floor = frame_floor(header)
    assert [len(f) - floor for f in frames] == [16, 32, 64]
    events = SSEDecoder().feed(b"".join(frames))
    assert [orjson.loads(e.data)["choices"][0]["delta"] for e in events] == [
        {"role": "assistant"}, {"content": "x" * 17}, {"content": "y" * 40},
    ]  # fmt: skip


def test_a_padded_heartbeat_is_a_comment_the_size_of_a_token() -> None:
    frames = _stream(_header(), [Heartbeat(), Delta(0, "a")])
    assert frames[1].startswith(b": keep-alive ")
    assert len(frames[1]) == len(frames[2])
    decoder = SSEDecoder()
    assert len(decoder.feed(frames[1])) == 0
    assert decoder.comments == 1


def test_errors_parts_logprobs_and_continuous_usage_are_padded_too() -> None:
    header = _header(n=2, continuous_usage=True)
    token = LogprobToken("a", b"a", -0.5, 1)
    events: list[StreamEvent] = [
        Delta(0, "a", usage=Usage(9, 1)),
        Delta(1, "b", logprobs=(token,), usage=Usage(9, 2)),
        Finish(0, STOP, usage=Usage(9, 2)),
        Delta(1, "c"),
        Fail("boom " * 30, code="internal_error"),
    ]
    frames = _stream(header, events)
    floor = frame_floor(header)
    plain = _stream(header, events, seed=None)
    assert [_unpadded(f) for f in frames] == [_unpadded_plain(f) for f in plain]
    for frame in frames:
        assert len(frame) - floor in (16, 32, 64, 128, 256)
    # The two role chunks, the first content chunk and the finish: one size.
    assert len({len(f) for f in (frames[0], frames[1], frames[2], frames[4])}) == 1


@given(text=wire_text, index=st.integers(0, 11), usage=st.booleans())
def test_the_padded_fast_path_matches_the_plain_build(
    text: str, index: int, usage: bool
) -> None:
    if not text:
        return  # sends nothing
    for endpoint in Endpoint:
        header = _header(endpoint, n=12, include_usage=usage)
        fast_machine, plain_machine = (StreamMachine(header, Filler(3)) for _ in "ab")
        assert fast_machine.start() == plain_machine.start()
        (fast,) = fast_machine.feed(Delta(index, text))
        # Empty parts take the general path, with the same chunk.
        (plain,) = plain_machine.feed(Delta(index, text, parts=DeltaParts()))
        assert fast == plain
        before, between, after, size = split_padded_frame(header, index)
        assert fast.startswith(before)
        assert between in fast
        assert fast.endswith(after)
        assert size + len(orjson.dumps(text)) <= len(fast)
        payload = content_chunk(header, index, text)
        payload[PAD_FIELD] = _unpadded_pad(fast)
        assert fast == b"data: " + orjson.dumps(payload) + b"\n\n"


@settings(max_examples=25)  # each example writes 600 frames twice
@given(st.lists(wire_text, min_size=1, max_size=12), st.integers(0, 2**32))
def test_padded_fast_frames_match_the_plain_build_past_the_filler_pool(
    texts: list[str], seed: int
) -> None:
    # The fast path cuts the filler's pool itself while a text fits the first
    # step, and leaves longer texts and an exhausted pool to the padder: the
    # same characters, frame after frame, and the same filler after them.
    header = _header(Endpoint.CHAT)
    fast_machine, plain_machine = (StreamMachine(header, Filler(seed)) for _ in "ab")
    assert fast_machine.start() == plain_machine.start()
    for n in range(600):  # 600 short texts' pads: past one pool of 4,096
        text = texts[n % len(texts)]
        fast = fast_machine.feed(Delta(0, text))
        assert fast == plain_machine.feed(Delta(0, text, parts=DeltaParts()))
    assert fast_machine.feed(Heartbeat()) == plain_machine.feed(Heartbeat())


def _unpadded_pad(frame: bytes) -> str:
    pad: str = orjson.loads(frame[len(b"data: ") : -2])[PAD_FIELD]
    return pad


def test_reasoning_deltas_are_padded_to_the_size_of_content_deltas() -> None:
    header = _header()
    events: list[StreamEvent] = [
        Delta(0, "", parts=DeltaParts(reasoning="a")),
        Delta(0, "b"),
        Delta(0, "", parts=DeltaParts(reasoning="plan: 2+2=4, so the answer")),
        Finish(0, STOP),
        End(Usage(9, 3, reasoning_tokens=2)),
    ]
    frames = _stream(header, events)
    plain = _stream(header, events, seed=None)
    assert [_unpadded(f) for f in frames] == [_unpadded_plain(f) for f in plain]
    floor = frame_floor(header)
    for frame in frames[:-1]:  # all but [DONE]
        assert len(frame) - floor in (16, 32, 64, 128, 256)
    # A one-character reasoning delta is the size of a one-character content one.
    assert len(frames[1]) == len(frames[2])
