"""The engine process's frames: whatever way the bytes are split, the same
messages come out, in order; a length past the bound ends the reader."""

import struct

import pytest

from sluicegate.core.events import EngineOutput, FinishReason
from sluicegate.engines.remote.frames import (
    MAX_FRAME_BYTES,
    OUTPUT,
    FrameReader,
    FrameTooLarge,
    encode_frames,
)

MESSAGES: list[tuple[object, ...]] = [
    (OUTPUT, "chatcmpl-a-0", EngineOutput((1, 2))),
    (OUTPUT, "chatcmpl-b-0", EngineOutput((3,), FinishReason.STOP)),
    ("end", "chatcmpl-c-0"),
]


def test_every_split_of_two_frames_gives_the_same_messages() -> None:
    wire = encode_frames(MESSAGES[:2]) + encode_frames(MESSAGES[2:])
    for cut in range(len(wire) + 1):
        reader = FrameReader()
        assert reader.feed(wire[:cut]) + reader.feed(wire[cut:]) == MESSAGES


def test_one_byte_at_a_time_gives_each_frame_once_it_is_whole() -> None:
    wire = encode_frames(MESSAGES[:1])
    reader = FrameReader()
    got = [reader.feed(wire[i : i + 1]) for i in range(len(wire))]
    assert got[:-1] == [[]] * (len(wire) - 1)
    assert got[-1] == MESSAGES[:1]


def test_no_messages_is_no_frame() -> None:
    assert encode_frames([]) == b""
    assert FrameReader().feed(b"") == []


def test_a_length_past_the_bound_is_refused_before_it_is_buffered() -> None:
    with pytest.raises(FrameTooLarge, match="at most"):
        FrameReader().feed(struct.pack(">I", MAX_FRAME_BYTES + 1))
