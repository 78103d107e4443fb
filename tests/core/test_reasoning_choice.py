"""Reasoning through a choice's decoder and a response's: token ids in, reasoning
deltas before content deltas, stop strings on the content only, counts exact."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.reasoning import (
    ReasoningPhase,
    ReasoningSplitter,
    ReasoningStep,
)
from sluicegate.core.decoding.reasoning_choice import (
    ReasoningChoiceDecoder,
    request_reasoning,
)
from sluicegate.core.decoding.reasoning_parsers import ReasoningParser, reasoning_parser
from sluicegate.core.decoding.response import ChoiceOptions, ResponseDecoder
from sluicegate.core.decoding.stop_pattern import compile_stops
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.decoding.tooldecoder import ToolCallOptions, new_response_decoder
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import (
    Delta,
    End,
    EngineOutput,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    TokenLogprob,
    Usage,
)
from sluicegate.core.logprobs import LogprobToken
from sluicegate.core.wire.chunks import (
    Endpoint,
    ResponseHeader,
    usage_dict,
)
from sluicegate.core.wire.completions import chat_completion
from tests.reasoning_splits import S28, S28_WIDE, marker_splits

QWEN3 = reasoning_parser("qwen3")
R1 = reasoning_parser("deepseek_r1")
STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH
CONTENT = ReasoningPhase.CONTENT


@dataclass(frozen=True)
class _Vocabulary:
    pieces: Sequence[bytes]
    special_ids: frozenset[int]
    stop_ids: frozenset[int]


def _vocabulary(tokens: Sequence[bytes]) -> tuple[_Vocabulary, list[int]]:
    """A vocabulary holding ``tokens`` (and ``<eos>`` last), and their ids."""
    pieces = list(dict.fromkeys(tokens))
    eos = len(pieces)
    ids = {p: i for i, p in enumerate(pieces)}
    vocabulary = _Vocabulary((*pieces, b"<eos>"), frozenset({eos}), frozenset({eos}))
    return vocabulary, [ids[t] for t in tokens]


def _run(
    tokens: Sequence[bytes],
    parser: ReasoningParser | None = QWEN3,
    *,
    stops: Sequence[str] = (),
    reason: FinishReason = STOP,
    tools: ToolCallOptions | None = None,
) -> list[StreamEvent]:
    vocabulary, ids = _vocabulary(tokens)
    decoder = new_response_decoder(
        tools,
        [ChoiceOptions()],
        vocabulary,
        prompt_tokens=2,
        stops=stops,
        reasoning=parser,
    )
    eos = len(vocabulary.pieces) - 1
    events: list[StreamEvent] = []
    for token_id in ids:
        events += decoder.feed(0, EngineOutput((token_id,)))
    last = (eos,) if reason is STOP else ()
    events += decoder.feed(0, EngineOutput(last, reason))
    return events


def _channels(events: Sequence[StreamEvent]) -> tuple[str, str]:
    """The reasoning and the content the events carry, checking that every
    reasoning delta comes before the first content delta."""
    reasoning: list[str] = []
    content: list[str] = []
    for event in events:
        if isinstance(event, Delta):
            if event.parts is not None and event.parts.reasoning:
                assert event.text == ""
                assert not content, "reasoning after content"
                reasoning.append(event.parts.reasoning)
            else:
                content.append(event.text)
    return "".join(reasoning), "".join(content)


@pytest.mark.parametrize(
    ("text", "reasoning", "content"),
    [
        (S28, "plan: 2+2=4", "The answer is 4."),
        (S28_WIDE, "plan: 2+2≈4€", "€The answer is 4 ≈."),
    ],
)
def test_every_split_of_the_markers_gives_the_same_channels_and_count(
    text: str, reasoning: str, content: str
) -> None:
    for tokens in marker_splits(text):
        events = _run(tokens)
        assert _channels(events) == (reasoning, content), tokens
        # The tokens up to and including the one that completes "</think>".
        spent = len(text[: text.index("</think>") + len("</think>")].encode())
        through = next(
            i for i in range(len(tokens) + 1) if len(b"".join(tokens[:i])) >= spent
        )
        end = events[-1]
        assert isinstance(end, End)
        assert end.usage == Usage(2, len(tokens) + 1, reasoning_tokens=through), tokens


def test_a_cut_inside_the_reasoning_delivers_it_all_and_counts_every_token() -> None:
    tokens = [b"<think>", b"plan: 2", b"+2=4</th"]
    events = _run(tokens, reason=LENGTH)
    assert _channels(events) == ("plan: 2+2=4</th", "")
    assert events[-2:] == [Finish(0, LENGTH), End(Usage(2, 3, reasoning_tokens=3))]


def test_stop_strings_apply_to_the_content_only() -> None:
    tokens = [b"<think>", b"Answer:", b" 4", b"</think>", b"Answer:", b" 4"]
    events = _run(tokens, stops=["Answer:"])
    assert _channels(events) == ("Answer: 4", "")
    assert events[-2:] == [
        Finish(0, STOP, None, "Answer:"),
        End(Usage(2, 5, reasoning_tokens=4)),
    ]


def test_a_stop_string_in_the_step_that_ends_the_reasoning() -> None:
    events = _run([b"<think>", b"a</think>b. c", b" more"], stops=["."])
    assert _channels(events) == ("a", "b")
    assert events[-1] == End(Usage(2, 2, reasoning_tokens=2))


def test_no_start_marker_is_all_content_and_reasoning_tokens_are_zero() -> None:
    events = _run([b"The", b" answer"])
    assert _channels(events) == ("", "The answer")
    assert events[-1] == End(Usage(2, 3, reasoning_tokens=0))
    assert usage_dict(Usage(2, 3, reasoning_tokens=0))["completion_tokens_details"] == {
        "reasoning_tokens": 0
    }


def test_a_parser_that_does_not_reason_keeps_the_plain_decoder() -> None:
    events = _run([b"<think>", b"x"], reasoning_parser("none"))
    assert _channels(events) == ("", "<think>x")
    assert events[-1] == End(Usage(2, 3))
    assert "completion_tokens_details" not in usage_dict(Usage(2, 3))


def test_tool_call_parsing_sees_the_content_only() -> None:
    call = b'<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    events = _run(
        [b"<think>", b"<tool_call>no", b"</think>", call],
        tools=ToolCallOptions(("f",)),
    )
    reasoning = [
        e.parts.reasoning
        for e in events
        if isinstance(e, Delta) and e.parts and e.parts.reasoning
    ]
    calls = [
        f
        for e in events
        if isinstance(e, Delta) and e.parts
        for f in e.parts.tool_calls
    ]
    assert "".join(reasoning) == "<tool_call>no"
    assert [c.name for c in calls if c.name] == ["f"]
    assert events[-2].finish_reason is FinishReason.TOOL_CALLS  # type: ignore[union-attr]


def _with_logprobs(
    tokens: Sequence[bytes],
    parser: ReasoningParser = QWEN3,
    reason: FinishReason = STOP,
) -> list[StreamEvent]:
    vocabulary, ids = _vocabulary(tokens)
    decoder = ResponseDecoder(
        [ChoiceOptions()], vocabulary, prompt_tokens=1, logprobs=True, reasoning=parser
    )
    eos = len(vocabulary.pieces) - 1
    events: list[StreamEvent] = []
    for token_id in ids:
        logprob = TokenLogprob(token_id, -1.0)
        events += decoder.feed(0, EngineOutput((token_id,), None, (logprob,)))
    last = (eos,) if reason is STOP else ()
    lps = tuple(TokenLogprob(t, -1.0) for t in last)
    events += decoder.feed(0, EngineOutput(last, reason, lps))
    return events


def _logprob_pieces(events: Sequence[StreamEvent]) -> list[bytes]:
    return [
        lp.token_bytes
        for e in events
        if isinstance(e, Delta) and e.logprobs
        for lp in e.logprobs
    ]


def test_logprobs_are_the_content_tokens_for_every_split() -> None:
    for tokens in marker_splits(S28):
        events = _with_logprobs(tokens)
        assert _channels(events) == ("plan: 2+2=4", "The answer is 4."), tokens
        # The token that completes "</think>" and every later one (the content's).
        text = b""
        boundary = 0
        for i, token in enumerate(tokens):
            text += token
            if b"</think>" in text:
                boundary = i
                break
        first = boundary if text.split(b"</think>", 1)[1] else boundary + 1
        pieces = _logprob_pieces(events)
        # The token that ended the reasoning is reported with its content part
        # only: the tokens' bytes join to the content.
        assert b"".join(pieces) == b"The answer is 4.", tokens
        assert pieces[1:] == list(tokens[first + 1 :]), tokens
        assert tokens[first].endswith(pieces[0]), tokens
        for event in events:
            if isinstance(event, Delta) and event.parts is not None:
                assert event.logprobs is None  # reasoning carries none


def test_tokens_held_as_a_start_marker_carry_their_logprobs_into_the_content() -> None:
    events = _with_logprobs([b"<th", b"e", b"re"])
    assert _channels(events) == ("", "<there")
    assert _logprob_pieces(events) == [b"<th", b"e", b"re"]
    # Cut while held: the flush releases them as content, with their logprobs.
    events = _with_logprobs([b"<", b"th"], reason=LENGTH)
    assert _channels(events) == ("", "<th")
    assert _logprob_pieces(events) == [b"<", b"th"]
    # Held, then the reasoning opens: none.
    events = _with_logprobs([b"<th", b"ink>a", b"</think>", b"b"])
    assert _logprob_pieces(events) == [b"b"]
    # The token that ends the reasoning and writes content carries its logprob,
    # reported as its content part.
    events = _with_logprobs([b"<think>", b"a</think>b", b"c"])
    assert _channels(events) == ("a", "bc")
    assert _logprob_pieces(events) == [b"b", b"c"]
    # Starting inside: a held marker that turns out to be reasoning carries none.
    events = _with_logprobs([b"<th", b"at", b"</think>b"], R1)
    assert _channels(events) == ("<that", "b")
    assert _logprob_pieces(events) == [b"b"]


def test_the_token_that_ends_the_reasoning_is_reported_as_its_answer_part() -> None:
    # Its text and bytes from the end marker on; its logprob and offset the
    # answer's first; a multi-byte character after the marker kept whole.
    events = _with_logprobs([b"<think>", b"a</thi", "nk>é".encode(), b"c"])
    reported = [lp for e in events if isinstance(e, Delta) for lp in e.logprobs or ()]
    assert [(lp.token, lp.token_bytes, lp.text_offset) for lp in reported] == [
        ("é", "é".encode(), 0),
        ("c", b"c", 1),
    ]
    assert reported[0].logprob == -1.0
    # A stop string the same token completes: reported whole, as a token a
    # stop string cuts is.
    vocabulary, ids = _vocabulary([b"<think>", b"a</think>b.", b"c"])
    decoder = ResponseDecoder(
        [ChoiceOptions()],
        vocabulary,
        prompt_tokens=1,
        logprobs=True,
        reasoning=QWEN3,
        stops=["."],
    )
    out: list[StreamEvent] = []
    for token_id in ids:
        lp = TokenLogprob(token_id, -1.0)
        out += decoder.feed(0, EngineOutput((token_id,), None, (lp,)))
    assert _channels(out) == ("a", "b")
    assert _logprob_pieces(out) == [b"a</think>b."]


def _choice_decoder(
    tokens: Sequence[bytes], stops: Sequence[str] = ()
) -> tuple[ReasoningChoiceDecoder, list[int]]:
    vocabulary, ids = _vocabulary(tokens)
    detokenizer = IncrementalDetokenizer(vocabulary.pieces, vocabulary.special_ids)
    matcher = StopMatcher(compile_stops(stops))
    return ReasoningChoiceDecoder(detokenizer, matcher, ReasoningSplitter(R1)), ids


def test_choice_decoder_feeds_many_ids_at_once_and_flushes_a_held_marker() -> None:
    decoder, ids = _choice_decoder([b"plan", b"</th"])
    step = decoder.feed(ids)
    assert (step.reasoning, step.text) == ("plan", "")
    assert decoder.feed(()).text == ""  # nothing: the shared empty step
    assert decoder.reasoning_tokens == 2
    last = decoder.flush()
    assert (last.reasoning, last.text, last.finish_reason) == ("</th", "", None)
    with pytest.raises(LocalProtocolError):
        decoder.feed(ids)
    with pytest.raises(LocalProtocolError):
        decoder.flush()


def test_choice_decoder_tail_is_split_and_stop_checked_without_counting() -> None:
    # An incomplete UTF-8 tail becomes U+FFFD at flush(): it goes to its channel.
    decoder, ids = _choice_decoder([b"a</think>x", b"\xe2"], stops=["x\ufffd"])
    step = decoder.feed(ids)
    assert (step.reasoning, step.text) == ("a", "")
    last = decoder.flush()
    assert (last.text, last.finish_reason) == ("", STOP)
    assert decoder.completion_tokens == 2
    decoder, ids = _choice_decoder([b"a</think>x", b"\xe2"])
    assert decoder.feed(ids).text == "x"
    assert decoder.flush().text == "\ufffd"


def test_choice_decoder_after_a_stop_discards_and_flushes_nothing() -> None:
    decoder, ids = _choice_decoder([b"</think>ab", b"c"], stops=["b"])
    step = decoder.feed(ids[:1])
    assert (step.text, step.finish_reason) == ("a", STOP)
    assert decoder.feed(ids[1:]).text == ""
    assert decoder.completion_tokens == 1
    last = decoder.flush()
    assert (last.reasoning, last.text, last.finish_reason) == ("", "", None)


def _inside(parser: ReasoningParser | None) -> bool:
    assert parser is not None
    return parser.starts_inside


def test_request_reasoning_reads_the_prompt_then_the_request_then_the_parser() -> None:
    assert request_reasoning(None, "x") is None
    assert request_reasoning(reasoning_parser("none"), "x") is None
    # The prompt's tail decides first.
    assert _inside(request_reasoning(QWEN3, "<start>\n<think>\n"))
    assert not _inside(request_reasoning(R1, "<think></think>\n", thinking=True))
    # Then the request's option, then the parser's default.
    assert _inside(request_reasoning(QWEN3, "x", thinking=True))
    assert not _inside(request_reasoning(R1, "x", thinking=False))
    assert request_reasoning(R1, "x") is R1
    no_start = ReasoningParser("inside", "", "</r>", starts_inside=True)
    assert request_reasoning(no_start, "x") is no_start
    assert request_reasoning(no_start, "x", thinking=False) is None


def test_end_reasoning_releases_what_is_held_to_its_channel() -> None:
    inside = ReasoningSplitter(R1)
    inside.feed("<thi")  # may still be the start marker: held
    assert inside.end_reasoning() == ReasoningStep("<thi", "", CONTENT)
    assert inside.reasoning_tokens == 1
    assert inside.feed("</think>x") == ReasoningStep("", "</think>x", CONTENT)
    assert inside.end_reasoning() == ReasoningStep("", "", CONTENT)
    outside = ReasoningSplitter(QWEN3)
    outside.feed("<thi")
    assert outside.end_reasoning() == ReasoningStep("", "<thi", CONTENT)
    assert outside.reasoning_tokens == 0
    reasoning = ReasoningSplitter(QWEN3)
    reasoning.feed("<think>a</th")
    assert reasoning.end_reasoning() == ReasoningStep("</th", "", CONTENT)
    reasoning.flush()
    with pytest.raises(LocalProtocolError):
        reasoning.end_reasoning()


def test_a_budget_ends_the_reasoning_at_its_last_token() -> None:
    vocabulary, ids = _vocabulary([b"<think>", b"a", b"b</th", b"ink>c"])
    detokenizer = IncrementalDetokenizer(vocabulary.pieces, vocabulary.special_ids)
    splitter = ReasoningSplitter(QWEN3)
    decoder = ReasoningChoiceDecoder(
        detokenizer, StopMatcher(compile_stops(["ink"])), splitter, budget_tokens=3
    )
    step = decoder.feed(ids[:3])
    assert (step.reasoning, step.text) == ("ab</th", "")
    step = decoder.feed(ids[3:])  # after the budget: content, stop strings apply
    assert (step.reasoning, step.text, step.finish_reason) == ("", "", STOP)
    assert decoder.reasoning_tokens == 3


def test_a_text_engines_reasoning_goes_first_and_is_counted() -> None:
    decoder = ResponseDecoder([ChoiceOptions()], None, prompt_tokens=0)
    events = list(
        decoder.feed(0, TextOutput("", reasoning="plan", completion_tokens=2))
    )
    events += decoder.feed(0, TextOutput("4", reasoning="!"))
    assert decoder.usage == Usage(0, 3, reasoning_tokens=3)  # the steps' tokens
    events += decoder.feed(0, TextOutput("", STOP, 0, 5, reasoning_tokens=2))
    assert _channels(events) == ("plan!", "4")
    assert events[-1] == End(Usage(5, 3, reasoning_tokens=2))  # the engine's count


def test_a_text_engines_plain_markers_are_split_when_a_parser_is_given() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, stops=["!"], reasoning=QWEN3
    )
    events: list[StreamEvent] = []
    for piece in ["<th", "ink>pl", "an</thi", "nk>4", "!", " more"]:
        events += decoder.feed(0, TextOutput(piece))
    assert _channels(events) == ("plan", "4")
    assert events[-2:] == [
        Finish(0, STOP, None, "!"),
        End(Usage(0, 5, reasoning_tokens=4)),
    ]


@pytest.mark.parametrize(
    ("stops", "content", "reason"),
    [([], "4 </th", LENGTH), (["</th"], "4 ", STOP)],
)
def test_a_text_choices_held_text_is_split_and_stop_checked_at_the_end(
    stops: list[str], content: str, reason: FinishReason
) -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, stops=stops, reasoning=R1
    )
    events = list(decoder.feed(0, TextOutput("a</th")))  # held: may be the marker
    events += decoder.feed(0, TextOutput("ink>4 </th"))
    events += decoder.feed(0, TextOutput("", LENGTH, 0))
    assert _channels(events) == ("a", content)
    assert isinstance(events[-2], Finish)
    assert events[-2].finish_reason is reason
    # A cut inside the reasoning: the held marker is reasoning.
    decoder = ResponseDecoder([ChoiceOptions()], None, prompt_tokens=0, reasoning=R1)
    events = list(decoder.feed(0, TextOutput("a</th")))
    events += decoder.feed(0, TextOutput("", LENGTH, 0))
    assert _channels(events) == ("a</th", "")
    # After a stop string: the flush gives nothing.
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, stops=["x"], reasoning=R1
    )
    events = list(decoder.feed(0, TextOutput("a</think>bx")))
    assert _channels(events) == ("a", "b")


def test_a_text_choices_held_start_marker_may_complete_a_stop_at_the_end() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, stops=["<th"], reasoning=QWEN3
    )
    events = list(decoder.feed(0, TextOutput("<thi")))  # held: may open reasoning
    assert events == []
    events += decoder.feed(0, TextOutput("", LENGTH, 0))
    assert _channels(events) == ("", "")
    assert events[-2] == Finish(0, STOP, None, "<th")


def test_a_whole_chat_completion_names_each_choices_reasoning() -> None:
    header = ResponseHeader("chatcmpl-1", 1, "m", Endpoint.CHAT, n=2)
    usage = Usage(1, 4, reasoning_tokens=2)
    body = chat_completion(
        header, [("4", STOP), ("5", STOP)], usage, reasoning=["plan", ""]
    )
    messages = [choice["message"] for choice in body["choices"]]
    assert [m["reasoning_content"] for m in messages] == ["plan", None]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


def test_a_text_engines_split_reasoning_tokens_carry_no_logprobs() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, logprobs=True, reasoning=QWEN3
    )

    def token(text: str) -> LogprobToken:
        return LogprobToken(text, text.encode(), -1.0, 0)

    pieces = ["<think>", "plan", "</think>", "The", " answer"]
    item = TextOutput("".join(pieces), logprobs=tuple(map(token, pieces)))
    events = list(decoder.feed(0, item))
    events += decoder.feed(0, TextOutput("", STOP, 0))
    assert _channels(events) == ("plan", "The answer")
    assert _logprob_pieces(events) == [b"The", b" answer"]
    # The token that ended the reasoning: its content part only.
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, logprobs=True, reasoning=QWEN3
    )
    pieces = ["<think>", "plan</think>The", " answer"]
    item = TextOutput("".join(pieces), logprobs=tuple(map(token, pieces)))
    events = list(decoder.feed(0, item))
    events += decoder.feed(0, TextOutput("", STOP, 0))
    assert _channels(events) == ("plan", "The answer")
    reported = [lp for e in events if isinstance(e, Delta) for lp in e.logprobs or ()]
    assert [(lp.token, lp.token_bytes) for lp in reported] == [
        ("The", b"The"),
        (" answer", b" answer"),
    ]


@pytest.mark.parametrize(
    "pieces",
    [
        ["The", " answer"],  # content at once: its first token is whole
        ["<", "Hi"],  # a held start marker ruled out by the next token
        ["<th", "Hi", "!"],
        ["<", "thi"],  # ruled out only by the end of the stream
        ["<", "think>", "p", "</thi", "nk>A"],  # it opened: the answer's only
        ["<think>p</think>", "A"],
    ],
)
def test_a_text_engines_held_start_marker_tokens_keep_their_logprobs(
    pieces: list[str],
) -> None:
    """Tokens an upstream sent that the splitter held as a possible start
    marker are content tokens, with their logprobs, when no marker opens: the
    reported tokens' bytes join to the content, as for token ids."""
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, logprobs=True, reasoning=QWEN3
    )
    events: list[StreamEvent] = []
    for piece in pieces:
        token = LogprobToken(piece, piece.encode(), -1.0, 0)
        events += decoder.feed(0, TextOutput(piece, logprobs=(token,)))
    events += decoder.feed(0, TextOutput("", LENGTH, 0))
    content = _channels(events)[1]
    assert b"".join(_logprob_pieces(events)) == content.encode()
    assert content == "".join(pieces).rpartition("</think>")[2]


def test_a_text_engines_crossing_step_without_logprobs_carries_none() -> None:
    """A step that ends the reasoning but came without logprobs (an upstream
    may leave them out of a chunk) reports no token for its content."""
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, logprobs=True, reasoning=R1
    )
    events = list(decoder.feed(0, TextOutput("plan</think>The")))
    token = LogprobToken(" end", b" end", -0.5, 0)
    events += decoder.feed(0, TextOutput(" end", logprobs=(token,)))
    events += decoder.feed(0, TextOutput("", STOP, 0))
    assert _channels(events) == ("plan", "The end")
    assert _logprob_pieces(events) == [b" end"]
