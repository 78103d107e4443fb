"""Tool calls through a response's decoder: parts per delta, the finish reason."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.response import ChoiceOptions, ResponseDecoder
from sluicegate.core.decoding.tooldecoder import (
    ToolCallDecoder,
    ToolCallOptions,
    new_response_decoder,
)
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    EngineOutput,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    TokenLogprob,
    ToolCallFragment,
    join_parts,
)

from .strategies import partitions

EOS = 256
CALL = '<tool_call>{"name": "f", "arguments": {"a": [1, "}"]}}</tool_call>'


@dataclass(frozen=True)
class Bytes:
    """One token per byte, and an end-of-sequence token."""

    pieces: Sequence[bytes] = (*(bytes([b]) for b in range(256)), b"")
    special_ids: frozenset[int] = frozenset({EOS})
    stop_ids: frozenset[int] = frozenset({EOS})


def _ids(text: str) -> tuple[int, ...]:
    return tuple(text.encode())


def _decoder(n: int = 1, **options: object) -> ToolCallDecoder:
    counter = itertools.count()
    return ToolCallDecoder(
        [ChoiceOptions()] * n,
        Bytes(),
        tools=ToolCallOptions(("f", "g")),
        new_id=lambda: f"call_{next(counter)}",
        prompt_tokens=3,
        **options,
    )


def _events(decoder: ToolCallDecoder, steps: Sequence[str], end: int | None = EOS):
    events: list[StreamEvent] = []
    for step in steps:
        events += decoder.feed(0, EngineOutput(_ids(step)))
    last = () if end is None else (end,)
    reason = FinishReason.STOP if end is not None else FinishReason.LENGTH
    events += decoder.feed(0, EngineOutput(last, reason))
    return events


def _said(events: Sequence[StreamEvent]) -> tuple[str, DeltaParts | None]:
    deltas = [e for e in events if isinstance(e, Delta)]
    parts = None
    for delta in deltas:
        parts = join_parts(parts, delta.parts)
    return "".join(d.text for d in deltas), parts


def test_a_call_becomes_a_start_delta_then_argument_deltas_then_tool_calls():
    events = _events(_decoder(), ["Hi ", CALL[:41], CALL[41:]])
    assert [e for e in events if isinstance(e, Delta)] == [
        Delta(0, "Hi "),
        Delta(0, "", parts=DeltaParts((ToolCallFragment(0, "call_0", "f", ""),))),
        Delta(0, "", parts=DeltaParts((ToolCallFragment(0, arguments='{"a'),))),
        Delta(
            0, "", parts=DeltaParts((ToolCallFragment(0, arguments='": [1, "}"]}'),))
        ),
    ]
    assert events[-2] == Finish(0, FinishReason.TOOL_CALLS)
    assert isinstance(events[-1], End)


def test_the_decoders_finish_reasons_say_tool_calls_too():
    decoder = _decoder()
    _events(decoder, [CALL])
    assert decoder.finish_reasons == (FinishReason.TOOL_CALLS,)


def test_max_tokens_cutting_a_call_finishes_with_length():
    decoder = _decoder()
    events = _events(decoder, [CALL[:45]], end=None)
    assert events[-2] == Finish(0, FinishReason.LENGTH)
    assert _said(events)[1] == DeltaParts(
        (ToolCallFragment(0, "call_0", "f", '{"a": ['),)
    )


def test_an_eos_inside_a_call_is_not_tool_calls():
    events = _events(_decoder(), [CALL[:45]])
    assert events[-2] == Finish(0, FinishReason.STOP)


def test_text_without_calls_passes_through_and_finishes_with_stop():
    decoder = _decoder()
    first = decoder.feed(0, EngineOutput(_ids("Hello")))
    assert first == [Delta(0, "Hello")]
    events = _events(decoder, [" <tool"])
    assert _said([*first, *events]) == ("Hello <tool", None)
    assert events[-2] == Finish(0, FinishReason.STOP)


def test_choices_parse_apart():
    decoder = _decoder(2)
    events = [*decoder.feed(1, EngineOutput(_ids(CALL), FinishReason.STOP))]
    events += decoder.feed(0, EngineOutput(_ids("no call"), FinishReason.STOP))
    assert decoder.finish_reasons == (FinishReason.STOP, FinishReason.TOOL_CALLS)
    assert {e.index for e in events if isinstance(e, Delta)} == {0, 1}


def test_logprobs_are_of_content_tokens_only():
    decoder = _decoder(logprobs=True)
    text = "Sure. " + CALL
    events: list[StreamEvent] = []
    for token_id in _ids(text):
        events += decoder.feed(
            0, EngineOutput((token_id,), None, (TokenLogprob(token_id, -0.5),))
        )
    events += decoder.feed(
        0, EngineOutput((EOS,), FinishReason.STOP, (TokenLogprob(EOS, -0.1),))
    )
    deltas = [e for e in events if isinstance(e, Delta)]
    assert all(not d.logprobs for d in deltas if d.parts is not None)
    tokens = [t for d in deltas for t in d.logprobs or ()]
    assert "".join(t.token for t in tokens) == "Sure. "
    assert events[-2] == Finish(0, FinishReason.TOOL_CALLS)


def test_logprobs_of_text_held_at_the_end_go_out_before_the_finish():
    decoder = _decoder(logprobs=True)
    events = list(
        decoder.feed(0, EngineOutput((ord("<"),), None, (TokenLogprob(60, -1.0),)))
    )
    assert events == []
    events += decoder.feed(
        0, EngineOutput((EOS,), FinishReason.STOP, (TokenLogprob(EOS, -0.1),))
    )
    deltas = [e for e in events if isinstance(e, Delta)]
    assert "".join(d.text for d in deltas) == "<"
    assert [t.token for d in deltas for t in d.logprobs or ()] == ["<"]


def test_a_dropped_head_sends_no_logprobs():
    decoder = _decoder(logprobs=True)
    for token_id in _ids("<tool_call>{"):
        decoder.feed(
            0, EngineOutput((token_id,), None, (TokenLogprob(token_id, -1.0),))
        )
    events = decoder.feed(0, EngineOutput((), FinishReason.LENGTH, ()))
    assert [e for e in events if isinstance(e, Delta)] == []
    assert events[-2] == Finish(0, FinishReason.LENGTH)


def test_text_engines_outputs_are_parsed_too():
    decoder = ToolCallDecoder(
        [ChoiceOptions()],
        None,
        tools=ToolCallOptions(("f",), max_calls=1),
        prompt_tokens=1,
    )
    events = decoder.feed(0, TextOutput(CALL + CALL, FinishReason.STOP))
    parts = _said(events)[1]
    assert parts is not None
    assert len(parts.tool_calls) == 1
    assert parts.tool_calls[0].id is not None
    assert parts.tool_calls[0].id.startswith("call_")


def test_new_response_decoder_is_plain_without_tools():
    plain = new_response_decoder(None, [ChoiceOptions()], Bytes(), prompt_tokens=1)
    assert type(plain) is ResponseDecoder
    tools = new_response_decoder(
        ToolCallOptions(("f",)), [ChoiceOptions()], Bytes(), prompt_tokens=1
    )
    assert isinstance(tools, ToolCallDecoder)


@given(st.data())
def test_any_grouping_of_tokens_says_the_same(data):
    text = data.draw(st.sampled_from(["Sure. " + CALL + "\n" + CALL, CALL, "a <b"]))
    ids = _ids(text)
    groups = data.draw(partitions(ids))
    one = _said(_events(_decoder(), [text]))
    decoder = _decoder()
    events: list[StreamEvent] = []
    for group in groups:
        events += decoder.feed(0, EngineOutput(tuple(group)))
    events += decoder.feed(0, EngineOutput((EOS,), FinishReason.STOP))
    assert _said(events) == one
