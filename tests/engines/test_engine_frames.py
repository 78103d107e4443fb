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


def test_a_request_keeps_its_reasoning_budget_on_the_way_to_the_engine() -> None:
    """The engine process forces the end marker at the budget (its llama.cpp
    engine declares reasoning budgets): the budget must cross with the request."""
    from sluicegate.core.decoding.reasoning_budget import ReasoningBudget
    from sluicegate.core.decoding.reasoning_parsers import reasoning_parser
    from sluicegate.engines.base import GenerateRequest, SamplingParams
    from sluicegate.engines.remote.frames import GENERATE

    budget = ReasoningBudget(reasoning_parser("deepseek_r1"), 1024)
    params = SamplingParams(max_tokens=2048, reasoning_budget=budget)
    message = (GENERATE, GenerateRequest("chatcmpl-a-0", (1, 2), params))
    (got,) = FrameReader().feed(encode_frames([message]))
    assert got == message
    request = got[1]
    assert isinstance(request, GenerateRequest)
    assert request.params.reasoning_budget == budget
