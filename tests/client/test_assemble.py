from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.client import StreamAssembler, StreamResult, TextDelta
from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason, Usage
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    chat_chunk,
    completion_chunk,
    usage_chunk,
)
from sluicegate.core.wire.sse import DONE, encode_comment

from .wire import HEADER, bytewise, chat_frames, error_body, frame, good_body


def assemble(
    parts: Sequence[bytes], n: int = 1, status: int = 200
) -> tuple[list[TextDelta], StreamResult]:
    assembler = StreamAssembler(n)
    assembler.head(status, {"Content-Type": "text/event-stream"}, 0.5)
    deltas = [d for i, p in enumerate(parts) for d in assembler.feed(p, 1.0 + i)]
    return deltas, assembler.flush(100.0)


def test_good_stream_is_finished_with_text_usage_and_role() -> None:
    deltas, result = assemble([good_body()])
    assert result.end_state is EndState.FINISHED
    assert result.text == "Hello wörld 🤖"
    assert [d.text for d in deltas] == ["Hel", "lo", " wörld 🤖"]
    assert result.finish_reason == "stop"
    assert result.choices[0].role == "assistant"
    assert result.usage == Usage(5, 3)
    assert result.saw_done
    assert result.events == 7  # role, 3 content, finish, usage, [DONE]
    assert result.headers == {"content-type": "text/event-stream"}


@pytest.mark.parametrize("split", range(len(good_body()) + 1))
def test_any_split_point_gives_the_same_result(split: int) -> None:
    body = good_body()
    _, whole = assemble([body])
    _, parts = assemble([body[:split], body[split:]])
    assert parts.choices == whole.choices
    assert parts.end_state is EndState.FINISHED


def test_one_byte_at_a_time_gives_the_same_deltas() -> None:
    deltas, result = assemble(bytewise(good_body()))
    assert "".join(d.text for d in deltas) == "Hello wörld 🤖"
    assert result.end_state is EndState.FINISHED
    assert result.usage == Usage(5, 3)


def test_every_proper_prefix_is_truncated_never_finished() -> None:
    body = good_body()
    for cut in range(len(body) - len(DONE) + 1):
        _, result = assemble([body[:cut]])
        assert result.end_state is EndState.TRUNCATED, cut


def test_finish_without_done_is_truncated() -> None:
    _, result = assemble(chat_frames(["x"]))
    assert result.finish_reason == "stop"
    assert not result.saw_done
    assert result.end_state is EndState.TRUNCATED


def test_in_band_error_is_errored_and_keeps_text_and_error() -> None:
    _, result = assemble([error_body()])
    assert result.end_state is EndState.ERRORED
    assert result.text == "ab"
    assert result.error is not None
    assert result.error["message"] == "engine fell over"
    assert result.comments == 1


def test_error_then_done_is_still_errored() -> None:
    _, result = assemble([error_body(), DONE])
    assert result.end_state is EndState.ERRORED


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"data: {not json\n\n", "neither JSON"),
        (b"data: [1, 2]\n\n", "not a JSON object"),
        (b'data: {"id": "x"}\n\n', "choices"),
        (b'data: {"choices": [{"delta": {}}]}\n\n', "choices"),
        (b"data: \xff\xfe\n\n", "UTF-8"),
    ],
)
def test_malformed_event_stops_the_stream_as_truncated(bad: bytes, reason: str) -> None:
    assembler = StreamAssembler()
    assembler.head(200, {}, 0.0)
    assembler.feed(chat_frames(["a"])[0], 0.1)
    assert assembler.feed(bad, 0.2) == []
    assert assembler.stopped
    assert assembler.feed(good_body(), 0.3) == []
    result = assembler.flush(0.4)
    assert result.end_state is EndState.TRUNCATED
    assert result.protocol_error is not None
    assert reason in result.protocol_error


def test_rejection_keeps_status_and_openai_error_body() -> None:
    body = b'{"error": {"message": "max_tokens too big", "type": "x", "param": "p"}}'
    deltas, result = assemble([body[:10], body[10:]], status=400)
    assert deltas == []
    assert result.end_state is EndState.REJECTED
    assert result.status == 400
    assert result.error == {"message": "max_tokens too big", "type": "x", "param": "p"}


def test_rejection_with_a_non_json_body_keeps_its_text() -> None:
    _, result = assemble([b"Bad Gateway"], status=502)
    assert result.end_state is EndState.REJECTED
    assert result.error == {"message": "Bad Gateway"}


def test_bytes_after_done_are_ignored() -> None:
    _, result = assemble([good_body(), frame(chat_chunk(HEADER, 0, {"content": "z"}))])
    assert result.text == "Hello wörld 🤖"
    assert result.events == 7


def test_two_choices_finish_only_when_both_have_a_finish_reason() -> None:
    header = ResponseHeader("c", 1, "m", Endpoint.CHAT, n=2)
    first = chat_frames(["a", "b"], index=0, header=header)
    second = chat_frames(["x"], index=1, header=header)
    _, partial = assemble([*first, DONE], n=2)
    assert partial.end_state is EndState.TRUNCATED
    _, done = assemble([*first[:2], *second, *first[2:], DONE], n=2)
    assert done.end_state is EndState.FINISHED
    assert [c.text for c in done.choices] == ["ab", "x"]


def test_completion_text_and_logprobs_are_assembled() -> None:
    header = ResponseHeader("cmpl", 1, "m", Endpoint.COMPLETION)
    chunk = completion_chunk(header, 0, "Hi")
    chunk["choices"][0]["logprobs"] = {
        "tokens": ["H", "i"],
        "token_logprobs": [-0.5, -0.25],
        "top_logprobs": None,
    }
    finish = completion_chunk(header, 0, "", FinishReason.LENGTH)
    _, result = assemble([frame(chunk), frame(finish), DONE])
    assert result.end_state is EndState.FINISHED
    assert result.text == "Hi"
    assert result.finish_reason == "length"
    assert [e["logprob"] for e in result.choices[0].logprobs] == [-0.5, -0.25]


def test_tool_call_fragments_are_joined_by_index() -> None:
    def tool(fragment: dict[str, object]) -> bytes:
        return frame(chat_chunk(HEADER, 0, {"tool_calls": [fragment]}))

    parts = [
        tool({"index": 0, "id": "call_1", "type": "function",
              "function": {"name": "get_", "arguments": ""}}),
        tool({"index": 1, "id": "call_2",
              "function": {"name": "b", "arguments": "{}"}}),
        tool({"index": 0, "function": {"name": "weather", "arguments": '{"ci'}}),
        tool({"index": 0, "function": {"arguments": 'ty": "Oslo"}'}}),
        frame(chat_chunk(HEADER, 0, {}, FinishReason.STOP)),
        DONE,
    ]  # fmt: skip
    _, result = assemble(parts)
    calls = result.choices[0].tool_calls
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, "call_1", "get_weather", '{"city": "Oslo"}'),
        (1, "call_2", "b", "{}"),
    ]
    assert calls[0].type == "function"


def test_tool_call_entries_without_index_begin_on_a_new_id_else_continue() -> None:
    def tool(*fragments: dict[str, object]) -> bytes:
        return frame(chat_chunk(HEADER, 0, {"tool_calls": list(fragments)}))

    parts = [
        tool({"function": {"arguments": '{"a"'}}),  # no call yet: index 0
        tool({"function": {"arguments": ": 1}"}}),
        tool({"id": "call_2", "type": "function",
              "function": {"name": "g", "arguments": "{}"}},
             {"id": "call_3", "function": {"name": "h", "arguments": "{"}}),
        tool({"id": "call_3", "function": {"arguments": "}"}}),
        tool({"index": 7, "id": "call_7",
              "function": {"name": "k", "arguments": "[]"}}),
        frame(chat_chunk(HEADER, 0, {}, FinishReason.TOOL_CALLS)),
        DONE,
    ]  # fmt: skip
    _, result = assemble(parts)
    calls = result.choices[0].tool_calls
    assert [(c.index, c.id, c.name, c.arguments) for c in calls] == [
        (0, None, "", '{"a": 1}'),
        (1, "call_2", "g", "{}"),
        (2, "call_3", "h", "{}"),
        (7, "call_7", "k", "[]"),
    ]
    assert result.choices[0].incomplete_tool_calls == ()


def test_a_call_whose_arguments_are_not_whole_json_is_kept_apart() -> None:
    def tool(fragment: dict[str, object]) -> bytes:
        return frame(chat_chunk(HEADER, 0, {"tool_calls": [fragment]}))

    parts = [
        tool({"index": 0, "id": "call_1", "type": "function",
              "function": {"name": "f", "arguments": ""}}),
        tool({"index": 0, "function": {"arguments": "{}"}}),
        tool({"index": 1, "id": "call_2", "type": "function",
              "function": {"name": "g", "arguments": ""}}),
        tool({"index": 1, "function": {"arguments": '{"city": "Os'}}),
        frame(chat_chunk(HEADER, 0, {}, FinishReason.LENGTH)),
        DONE,
    ]  # fmt: skip
    _, result = assemble(parts)
    choice = result.choices[0]
    assert [c.id for c in choice.tool_calls] == ["call_1"]
    assert [(c.id, c.arguments) for c in choice.incomplete_tool_calls] == [
        ("call_2", '{"city": "Os')
    ]


def test_chat_logprobs_content_entries_are_concatenated() -> None:
    chunk = chat_chunk(HEADER, 0, {"content": "a"})
    chunk["choices"][0]["logprobs"] = {"content": [{"token": "a", "logprob": -1.0}]}
    _, result = assemble([frame(chunk), frame(chunk)])
    assert [e["token"] for e in result.choices[0].logprobs] == ["a", "a"]


def test_timing_counts_heartbeats_as_activity() -> None:
    assembler = StreamAssembler()
    assembler.head(200, {}, 1.0)
    assembler.feed(encode_comment(), 3.0)
    assembler.feed(chat_frames(["a"])[0], 3.5)
    assembler.feed(chat_frames(["a"])[1], 4.5)
    result = assembler.flush(5.0)
    assert result.timing.gaps_s == (2.0, 0.5, 1.0)
    assert result.timing.max_gap_s == 2.0
    assert result.timing.head_s == 1.0
    assert result.timing.first_event_s == 3.5
    assert result.timing.first_token_s == 4.5
    assert result.timing.token_times_s == (4.5,)
    assert result.timing.end_s == 5.0


def test_client_gone_before_the_end_is_aborted() -> None:
    assembler = StreamAssembler()
    assembler.head(200, {}, 0.0)
    assembler.feed(chat_frames(["a"])[1], 0.1)
    assert assembler.flush(0.2, client_gone=True).end_state is EndState.ABORTED


def test_flush_twice_and_bad_n_are_misuse() -> None:
    assembler = StreamAssembler()
    assembler.flush(0.0)
    with pytest.raises(RuntimeError):
        assembler.flush(0.0)
    with pytest.raises(ValueError, match="n >= 1"):
        StreamAssembler(0)


@given(st.text(), st.data())
def test_core_encoding_then_client_decoding_is_the_identity(
    text: str, data: st.DataObject
) -> None:
    body = good_body([text] if text else [])
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=6)))
    parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    _, result = assemble(parts)
    assert result.text == text
    assert result.end_state is EndState.FINISHED


def test_reasoning_is_assembled_apart_from_the_text_in_either_field() -> None:
    deltas = [
        {"reasoning_content": "plan"},
        {"reasoning": ": 2+2"},
        {"reasoning_content": "=4", "reasoning": "=4"},  # both: taken once
        {"content": "4"},
    ]
    frames = [frame(chat_chunk(HEADER, 0, {"role": "assistant"}))]
    frames += [frame(chat_chunk(HEADER, 0, d)) for d in deltas]
    frames.append(frame(chat_chunk(HEADER, 0, {}, FinishReason.STOP)))
    frames.append(frame(usage_chunk(HEADER, Usage(5, 4, reasoning_tokens=3))))
    frames.append(DONE)
    text_deltas, result = assemble([b"".join(frames)])
    # Each delta's reasoning comes as it streams, never in the text.
    assert [(d.text, d.reasoning) for d in text_deltas] == [
        ("", "plan"),
        ("", ": 2+2"),
        ("", "=4"),
        ("4", ""),
    ]
    assert result.choices[0].reasoning == "plan: 2+2=4"
    assert result.text == "4"
    assert result.usage == Usage(5, 4, reasoning_tokens=3)
