"""Chunks with logprobs and continuous usage, built and streamed by the core."""

from __future__ import annotations

from typing import Any

import orjson

from sluicegate.core.events import Delta, End, Finish, FinishReason, Usage
from sluicegate.core.logprobs import LogprobToken, TopLogprob
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
)
from sluicegate.core.wire.completions import chat_completion, text_completion
from sluicegate.core.wire.stream import StreamMachine

HI = LogprobToken("Hi", b"Hi", -0.25, 0, (TopLogprob("Hi", b"Hi", -0.25),))
HEADER = ResponseHeader("id-1", 1700000000, "m", Endpoint.CHAT, include_usage=True)


def _payloads(frames: list[bytes]) -> list[Any]:
    return [
        "[DONE]" if f == b"data: [DONE]\n\n" else orjson.loads(f[6:-2]) for f in frames
    ]


def test_chunks_carry_logprobs_and_usage_when_given() -> None:
    usage = Usage(3, 1)
    chat = chat_chunk(HEADER, 0, {"content": "Hi"}, logprobs=[HI], usage=usage)
    assert chat["choices"][0]["logprobs"]["content"][0]["bytes"] == [72, 105]
    assert chat["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 1,
        "total_tokens": 4,
    }
    text = completion_chunk(HEADER, 0, "Hi", logprobs=[HI])
    assert text["choices"][0]["logprobs"]["tokens"] == ["Hi"]
    assert text["usage"] is None


def test_whole_responses_carry_each_choices_logprobs() -> None:
    choices = [("Hi", FinishReason.STOP), ("", FinishReason.LENGTH)]
    usage = Usage(3, 2)
    chat = chat_completion(HEADER, choices, usage, [[HI], None])
    assert [c["logprobs"] for c in chat["choices"]] == [
        {"content": [chat["choices"][0]["logprobs"]["content"][0]], "refusal": None},
        None,
    ]
    text = text_completion(HEADER, choices, usage, [[HI], []])
    assert text["choices"][0]["logprobs"]["text_offset"] == [0]
    assert text["choices"][1]["logprobs"]["tokens"] == []
    assert [
        c["logprobs"] for c in text_completion(HEADER, choices, usage)["choices"]
    ] == [
        None,
        None,
    ]


def test_continuous_usage_is_on_every_chunk_of_a_chat_stream() -> None:
    header = ResponseHeader(
        "id-1",
        1700000000,
        "m",
        Endpoint.CHAT,
        include_usage=True,
        continuous_usage=True,
        prompt_tokens=3,
    )
    machine = StreamMachine(header)
    frames = machine.start()
    frames += machine.feed(Delta(0, "Hi", (HI,), Usage(3, 1)))
    frames += machine.feed(Finish(0, FinishReason.STOP, Usage(3, 1)))
    frames += machine.feed(End(Usage(3, 1)))
    chunks = _payloads(frames)
    assert chunks[-1] == "[DONE]"
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [0, 1, 1, 1]
    assert chunks[1]["choices"][0]["logprobs"]["content"][0]["token"] == "Hi"
    assert chunks[2]["choices"][0]["logprobs"] is None


def test_the_role_chunks_continuous_usage_says_the_headers_cached_tokens() -> None:
    """A prompt's cached part known before the stream (the header's) is in
    the role chunk's usage, as in every later chunk's."""
    header = ResponseHeader(
        "id-1", 1700000000, "m", Endpoint.CHAT, include_usage=True,
        continuous_usage=True, prompt_tokens=5, cached_tokens=2,
    )  # fmt: skip
    (role,) = _payloads(StreamMachine(header).start())
    assert role["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


def test_completion_stream_deltas_carry_their_logprobs() -> None:
    header = ResponseHeader("id-1", 1700000000, "m", Endpoint.COMPLETION)
    machine = StreamMachine(header)
    assert machine.start() == []
    (chunk,) = _payloads(machine.feed(Delta(0, "Hi", (HI,))))
    assert chunk["choices"][0]["logprobs"]["token_logprobs"] == [-0.25]
    assert "usage" not in chunk
    assert machine.feed(Delta(0, "", ())) == []
