"""ResponseDecoder: engine items of every choice in, stream events out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.choice import ChoiceStep
from sluicegate.core.decoding.choice_setup import TextChoiceDecoder
from sluicegate.core.decoding.deltas import NO_CALL, CallTerms
from sluicegate.core.decoding.reasoning import ReasoningSplitter
from sluicegate.core.decoding.reasoning_parsers import reasoning_parser
from sluicegate.core.decoding.response import (
    ENDED_WITHOUT_FINISH,
    ChoiceOptions,
    OutputItem,
    ResponseDecoder,
)
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import EngineError, LocalProtocolError
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    EngineOutput,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    TokenLogprob,
    ToolCallFragment,
    Usage,
)
from sluicegate.core.logprobs import LogprobToken

from .strategies import partitions
from .toys import TOY

STOP, LENGTH = FinishReason.STOP, FinishReason.LENGTH
EOS = len(TOY)
CTRL = EOS + 1  # a control token that does not end a choice


@dataclass(frozen=True)
class _Vocabulary:
    pieces: Sequence[bytes] = (*TOY, b"<eos>", b"<ctrl>")
    special_ids: frozenset[int] = frozenset({EOS, CTRL})
    stop_ids: frozenset[int] = frozenset({EOS})


VOCABULARY = _Vocabulary()
# "Café costs 5€.\n" in the toy vocabulary: é and € split across tokens.
CAFE = [1, 2, 3, 4, 5, 6, 7, 8]


def _decoder(
    n: int = 1,
    *,
    choice: ChoiceOptions = ChoiceOptions(),  # noqa: B008 (frozen: shared is fine)
    vocabulary: _Vocabulary | None = VOCABULARY,
    stops: Sequence[str] = (),
    skip_special_tokens: bool = True,
    logprobs: bool = False,
    continuous_usage: bool = False,
) -> ResponseDecoder:
    return ResponseDecoder(
        [choice] * n,
        vocabulary,
        prompt_tokens=3,
        stops=stops,
        skip_special_tokens=skip_special_tokens,
        logprobs=logprobs,
        continuous_usage=continuous_usage,
        clock=lambda: 42.0,
    )


def _out(*ids: int, reason: FinishReason | None = None) -> EngineOutput:
    return EngineOutput(ids, reason)


def test_a_token_engines_cached_prompt_part_is_in_the_usage_once() -> None:
    decoder = _decoder()
    decoder.feed(0, EngineOutput((1,), None, None, cached_tokens=2))
    events = decoder.feed(0, _out(EOS, reason=STOP))
    assert events[-1] == End(Usage(3, 2, cached_tokens=2))
    assert not decoder.usage_estimated


def test_token_steps_become_deltas_then_finish_then_end() -> None:
    decoder = _decoder()
    events = [e for t in CAFE for e in decoder.feed(0, _out(t))]
    events += decoder.feed(0, _out(EOS, reason=STOP))
    assert events == [
        Delta(0, "Caf"),
        Delta(0, "é"),
        Delta(0, " costs"),
        Delta(0, " 5"),
        Delta(0, "€"),
        Delta(0, ".\n"),
        Finish(0, STOP),
        End(Usage(3, 9)),
    ]
    assert decoder.first_token_at == 42.0
    assert decoder.finish_reasons == (STOP,)
    assert decoder.closed(0)
    assert decoder.feed(0, _out(1)) == ()  # after the end: dropped
    assert decoder.aborts == []
    assert decoder.flush() == ()  # the engine ended it


def test_a_stop_string_names_the_sequence_to_abort_and_drops_what_follows() -> None:
    decoder = _decoder(stops=["costs"])
    events = [e for t in CAFE[:4] for e in decoder.feed(0, _out(t))]
    assert events == [
        Delta(0, "Caf"),
        Delta(0, "é"),
        Delta(0, " "),
        Finish(0, STOP, stop_sequence="costs"),
        End(Usage(3, 4)),
    ]
    assert decoder.aborts == [0]
    assert decoder.feed(0, _out(5)) == ()
    assert decoder.usage == Usage(3, 4)  # the token after the stop is not counted
    assert decoder.flush() == ()  # named once, in aborts


def test_held_back_text_goes_out_before_the_finish_at_length() -> None:
    decoder = _decoder(stops=["costs more"])
    assert decoder.feed(0, _out(1, 2, 3)) == (Delta(0, "Café"),)
    events = decoder.feed(0, _out(4, reason=LENGTH))
    assert events == [
        Delta(0, " "),
        Delta(0, "costs"),
        Finish(0, LENGTH),
        End(Usage(3, 4)),
    ]


def test_end_waits_for_the_last_choice_and_sums_completion_tokens() -> None:
    decoder = _decoder(2)
    assert decoder.feed(1, _out(1, reason=LENGTH)) == [
        Delta(1, "Caf"),
        Finish(1, LENGTH),
    ]
    assert decoder.finish_reasons == (None, LENGTH)
    assert decoder.feed(0, _out(1, 4, reason=LENGTH)) == [
        Delta(0, "Caf costs"),
        Finish(0, LENGTH),
        End(Usage(3, 3)),
    ]


def test_echo_comes_first_and_logprob_offsets_count_it() -> None:
    decoder = _decoder(choice=ChoiceOptions(echo="Hi"), logprobs=True)
    assert decoder.start(0) == [Delta(0, "Hi")]
    [delta] = decoder.feed(0, EngineOutput((1,), None, (TokenLogprob(1, -0.5),)))
    assert isinstance(delta, Delta)
    assert delta.text == "Caf"
    assert delta.logprobs is not None
    assert [(t.token, t.logprob, t.text_offset) for t in delta.logprobs] == [
        ("Caf", -0.5, 2)
    ]
    assert _decoder().start(0) == ()


def test_logprobs_cut_text_at_token_ends() -> None:
    decoder = _decoder(logprobs=True)
    lp = [TokenLogprob(t, -1.0) for t in (1, 2, 3)]
    events = decoder.feed(0, EngineOutput((1, 2, 3), None, tuple(lp)))
    texts = [(e.text, len(e.logprobs or ())) for e in events if isinstance(e, Delta)]
    assert texts == [("Caf", 1), ("é", 2)]


def test_missing_logprobs_are_one_engine_error() -> None:
    decoder = _decoder(logprobs=True)
    events = decoder.feed(0, _out(1))
    assert len(events) == 1
    assert isinstance(events[0], Fail)
    assert "one logprob per token id" in events[0].message
    assert decoder.flush() == ()  # counted as ended: the engine is not aborted


def test_continuous_usage_is_on_every_delta_and_finish() -> None:
    decoder = _decoder(continuous_usage=True)
    assert decoder.feed(0, _out(1)) == (Delta(0, "Caf", None, Usage(3, 1)),)
    assert decoder.feed(0, _out(4, reason=LENGTH)) == [
        Delta(0, " costs", None, Usage(3, 2)),
        Finish(0, LENGTH, Usage(3, 2)),
        End(Usage(3, 2)),
    ]


@pytest.mark.parametrize(
    ("item", "message", "code"),
    [
        (None, ENDED_WITHOUT_FINISH, None),
        (EngineError("gone"), "gone", "engine_error"),
    ],
)
def test_an_engine_failure_is_one_fail_and_no_end(
    item: OutputItem, message: str, code: str | None
) -> None:
    decoder = _decoder()
    assert decoder.feed(0, item) == [Fail(message, code=code)]
    assert decoder.closed(0)
    assert decoder.flush() == ()


def test_a_bug_fails_the_choice_and_flush_still_names_its_sequence() -> None:
    decoder = _decoder(2)
    assert decoder.fail(0, "bug", "internal_error") == [
        Fail("bug", code="internal_error")
    ]
    assert decoder.closed(0)
    assert decoder.flush() == (0, 1)
    assert decoder.flush() == ()
    assert decoder.fail(1, "bug", "internal_error") == ()
    assert decoder.feed(1, _out(1)) == ()


def test_control_tokens_reach_the_text_only_when_asked() -> None:
    kept = _decoder(skip_special_tokens=False)
    assert kept.feed(0, _out(CTRL, 1)) == (Delta(0, "<ctrl>Caf"),)
    assert kept.feed(0, _out(EOS, reason=STOP))[0] == Finish(0, STOP)
    skipped = _decoder()
    assert skipped.feed(0, _out(CTRL, 1)) == (Delta(0, "Caf"),)


def test_ignore_eos_and_stop_token_ids_choose_what_ends_the_text() -> None:
    decoder = _decoder(
        choice=ChoiceOptions(ignore_eos=True, stop_token_ids=frozenset({8})),
        skip_special_tokens=False,
    )
    assert decoder.feed(0, _out(EOS, 1)) == (Delta(0, "<eos>Caf"),)
    assert decoder.feed(0, _out(8, reason=STOP))[0] == Finish(0, STOP)


# --- engines that yield text -------------------------------------------------


def test_text_items_skip_token_work_and_count_as_the_engine_says() -> None:
    decoder = _decoder(vocabulary=None, stops=["5€"])
    assert decoder.feed(0, TextOutput("Café", None, 3)) == (Delta(0, "Café"),)
    assert decoder.first_token_at == 42.0
    assert decoder.feed(0, TextOutput(" costs 5", None, 2)) == (Delta(0, " costs "),)
    assert decoder.feed(0, TextOutput("€ more", None, 2)) == [
        Finish(0, STOP, stop_sequence="5€"),
        End(Usage(3, 7)),
    ]
    assert decoder.aborts == [0]
    assert decoder.feed(0, TextOutput("x", None, 1)) == ()


def test_text_held_back_is_flushed_at_the_engines_finish() -> None:
    decoder = _decoder(vocabulary=None, stops=["Café!"])
    assert decoder.feed(0, TextOutput("Caf", None, 1)) == ()
    assert decoder.feed(0, TextOutput("é", STOP, 1)) == [
        Delta(0, "Café"),
        Finish(0, STOP),
        End(Usage(3, 2)),
    ]


def test_a_stop_string_the_text_engine_matched_itself_is_named() -> None:
    decoder = _decoder(vocabulary=None, stops=["END"])
    assert decoder.feed(0, TextOutput("Hi", STOP, 1, stop_sequence="END")) == [
        Delta(0, "Hi"),
        Finish(0, STOP, stop_sequence="END"),
        End(Usage(3, 1)),
    ]
    assert decoder.stop_sequences == ("END",)
    length = _decoder(vocabulary=None, stops=["END"])
    finish = length.feed(0, TextOutput("Hi", LENGTH, 1, stop_sequence="END"))
    assert finish[1] == Finish(0, LENGTH)  # only a stop names its string
    assert length.stop_sequences == (None,)


def test_a_call_past_the_most_cuts_the_choice_after_the_ones_before() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()],
        None,
        prompt_tokens=3,
        calls=CallTerms(most=1),
        clock=lambda: 1.0,
    )
    first = ToolCallFragment(0, "call_a", "f", "")
    assert decoder.feed(0, TextOutput("", None, 1, tool_calls=(first,))) == [
        Delta(0, "", parts=DeltaParts((first,)))
    ]
    args = ToolCallFragment(0, arguments="{}")
    second = ToolCallFragment(1, "call_b", "g", "")
    events = decoder.feed(0, TextOutput("", None, 1, tool_calls=(args, second)))
    assert events == [
        Delta(0, "", parts=DeltaParts((args,))),
        Finish(0, FinishReason.TOOL_CALLS),
        End(Usage(3, 2)),
    ]
    assert decoder.aborts == [0]  # the engine is stopped: nothing more is read
    assert decoder.feed(0, TextOutput("", STOP, 1, tool_calls=(second,))) == ()
    assert decoder.flush() == ()


def test_tool_choice_none_ends_a_choice_as_a_plain_answer_where_its_call_begins() -> (
    None
):
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=3, calls=CallTerms(most=0)
    )
    call = ToolCallFragment(0, "call_a", "f", "{}")
    events = decoder.feed(0, TextOutput("Hi", None, 1, tool_calls=(call,)))
    assert events == [Delta(0, "Hi"), Finish(0, STOP), End(Usage(3, 1))]
    assert decoder.aborts == [0]


def test_a_choice_that_must_call_and_answers_in_words_fails_unless_cut_by_length() -> (
    None
):
    def run(last: TextOutput, stops: Sequence[str] = ()) -> ResponseDecoder:
        decoder = ResponseDecoder(
            [ChoiceOptions()],
            None,
            prompt_tokens=3,
            calls=CallTerms(required=True),
            stops=stops,
        )
        assert decoder.feed(0, TextOutput("Hi", None, 1)) == (Delta(0, "Hi"),)
        assert expected in decoder.feed(0, last)
        return decoder

    expected: object = Fail(NO_CALL, code="tool_call_missing")
    failed = run(TextOutput("", STOP, 1))
    assert failed.finish_reasons == (None,)  # no Finish, no End
    assert failed.flush() == ()  # the engine ended
    assert run(TextOutput(" END", None, 1), stops=["END"]).flush() == (0,)
    expected = Finish(0, LENGTH)
    run(TextOutput("", LENGTH, 1))
    call = ToolCallFragment(0, "call_a", "f", "{}")
    expected = Finish(0, FinishReason.TOOL_CALLS)
    run(TextOutput("", FinishReason.TOOL_CALLS, 1, tool_calls=(call,)))


def _lp(token: str, logprob: float = -0.5) -> LogprobToken:
    return LogprobToken(token, token.encode(), logprob, 0)


def test_a_text_engines_logprobs_are_cut_at_its_tokens_and_the_stop_string() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=3, stops=["END"], logprobs=True
    )
    first = (_lp("Hel"), _lp("lo"), _lp(" E"))
    events = decoder.feed(0, TextOutput("Hello E", None, 3, logprobs=first))
    # " E" may begin the stop string: its token waits with its text.
    assert events == [
        Delta(0, "Hel", (_lp("Hel"),)),
        Delta(0, "lo", (replace(_lp("lo"), text_offset=3),)),
    ]
    events = decoder.feed(0, TextOutput("ND!", None, 2, logprobs=(_lp("ND"), _lp("!"))))
    assert events == [
        Delta(0, " ", (replace(_lp(" E"), text_offset=5),)),  # cut by the stop
        Finish(0, STOP, stop_sequence="END"),
        End(Usage(3, 5)),
    ]


def test_text_without_its_tokens_goes_out_without_logprobs() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions(echo="Hi")], None, prompt_tokens=3, logprobs=True
    )
    mismatched = (_lp("x"),)
    assert decoder.feed(0, TextOutput("ab", None, 1, logprobs=mismatched)) == [
        Delta(0, "ab", ())
    ]
    assert decoder.feed(0, TextOutput("c", STOP, 1, logprobs=(_lp("c"),))) == [
        Delta(0, "c", (replace(_lp("c"), text_offset=4),)),
        Finish(0, STOP),
        End(Usage(3, 2)),
    ]


def test_a_prompt_counted_early_stands_until_the_engine_says_its_own() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()], None, prompt_tokens=0, continuous_usage=True
    )
    decoder.report_prompt(0, 5)
    assert decoder.feed(0, TextOutput("a", None, 1)) == (
        Delta(0, "a", usage=Usage(5, 1)),
    )
    events = decoder.feed(0, TextOutput("", STOP, 1, prompt_tokens=7))
    assert events[-1] == End(Usage(7, 2))
    decoder.report_prompt(0, 5)  # the engine's own count stays
    assert decoder.usage == Usage(7, 2)


def test_a_text_engine_counts_each_prompt_once_by_its_latest_report() -> None:
    decoder = ResponseDecoder(
        [ChoiceOptions()] * 3,
        None,
        prompt_tokens=0,
        prompt_of=[0, 0, 1],
        continuous_usage=True,
    )
    assert decoder.feed(0, TextOutput("a", None, 1, prompt_tokens=9)) == (
        Delta(0, "a", None, Usage(9, 1)),
    )
    decoder.feed(1, TextOutput("b", STOP, 1, prompt_tokens=9))  # the same prompt
    decoder.feed(2, TextOutput("c", STOP, 1, prompt_tokens=4))
    assert decoder.feed(0, TextOutput("", STOP, 0, prompt_tokens=10))[-1] == End(
        Usage(10 + 4, 3)
    )


def test_text_usage_is_exact_only_when_the_engine_ended_every_choice() -> None:
    decoder = ResponseDecoder([ChoiceOptions()] * 2, None, prompt_tokens=0)
    decoder.feed(0, TextOutput("a", STOP, 1, prompt_tokens=5))
    decoder.feed(1, TextOutput("b", None, 1, prompt_tokens=5))  # counts, no end
    before = decoder.usage_estimated
    decoder.feed(1, TextOutput("", STOP, 0, prompt_tokens=5))
    assert (before, decoder.usage_estimated) == (True, False)
    tokens = _decoder()
    assert not tokens.usage_estimated  # a token engine's counts are its own


def test_one_prompt_is_counted_once_without_a_prompt_map() -> None:
    decoder = ResponseDecoder([ChoiceOptions()] * 2, None, prompt_tokens=0)
    decoder.feed(0, TextOutput("a", STOP, 1, prompt_tokens=5))
    assert decoder.feed(1, TextOutput("b", STOP, 1, prompt_tokens=5))[-1] == End(
        Usage(5, 2)
    )


@given(st.data())
def test_any_split_of_the_steps_gives_the_same_text_and_count(
    data: st.DataObject,
) -> None:
    ids = data.draw(st.lists(st.sampled_from(range(1, len(TOY))), max_size=12))
    stops = data.draw(st.sampled_from([[], ["5€"], ["é c"], ["##END"]]))
    parts = data.draw(partitions(ids))

    def run(steps: Sequence[Sequence[int]]) -> tuple[str, Usage, tuple[object, ...]]:
        decoder = _decoder(stops=stops)
        events: list[StreamEvent] = []
        for step in steps:
            events += decoder.feed(0, _out(*step))
        events += decoder.feed(0, _out(reason=LENGTH))
        text = "".join(e.text for e in events if isinstance(e, Delta))
        return text, decoder.usage, decoder.finish_reasons

    assert run(parts) == run([[t] for t in ids])


def test_a_text_choice_decoder_refuses_use_after_flush() -> None:
    decoder = TextChoiceDecoder(StopMatcher(["x"]))
    assert decoder.feed("ax", 2) == ChoiceStep("a", STOP)
    assert decoder.feed("b", 1) == ChoiceStep("")
    assert decoder.completion_tokens == 2
    assert decoder.flush() == ChoiceStep("")
    with pytest.raises(LocalProtocolError):
        decoder.flush()
    plain = TextChoiceDecoder(StopMatcher([]))
    assert plain.flush() == ChoiceStep("")
    with pytest.raises(LocalProtocolError):
        plain.feed("a", 1)


def test_an_engine_that_splits_its_reasoning_ends_the_splitting_here() -> None:
    """Thinking on, the output begins inside the reasoning; an upstream that
    sends its own ``reasoning_content`` has split it, so its text is content."""
    qwen3 = reasoning_parser("qwen3")
    splitter = ReasoningSplitter(qwen3, starts_inside=True)
    decoder = TextChoiceDecoder(StopMatcher(["!"]), splitter)
    assert decoder.feed("a</th", 1) == ChoiceStep("", None, "a")
    decoder.engine_splits()
    decoder.engine_splits()  # again: nothing changes
    assert decoder.reasoning_tokens == 0  # the engine counts its own
    assert decoder.feed("", 1) == ChoiceStep("", None, "</th")  # held, as it was
    assert decoder.feed("The answer!", 1) == ChoiceStep("The answer", STOP)
    assert decoder.flush() == ChoiceStep("")


@pytest.mark.parametrize("stops", [(), ("5",)])
def test_with_logprobs_the_last_step_flushes_the_aligner(
    stops: tuple[str, ...],
) -> None:
    decoder = _decoder(logprobs=True, stops=stops)
    ids = (1, 4, 5, 8)
    lp = tuple(TokenLogprob(t, -1.0) for t in ids)
    events = decoder.feed(0, EngineOutput(ids, LENGTH, lp))
    deltas = [e for e in events if isinstance(e, Delta)]
    text = "".join(d.text for d in deltas)
    tokens = [t.token for d in deltas for t in d.logprobs or ()]
    if stops:
        assert (text, tokens) == ("Caf costs ", ["Caf", " costs", " 5"])
        assert decoder.aborts == [0]
        assert events[-2:] == [
            Finish(0, STOP, stop_sequence=stops[0]),
            End(Usage(3, 3)),
        ]
        assert decoder.stop_sequences == (stops[0],)
    else:
        assert (text, tokens) == ("Caf costs 5.\n", ["Caf", " costs", " 5", ".\n"])
        assert events[-2:] == [Finish(0, LENGTH), End(Usage(3, 4))]


def test_a_bug_after_a_choice_ended_is_still_one_fail() -> None:
    decoder = _decoder()
    decoder.feed(0, _out(1, reason=LENGTH))
    assert decoder.fail(0, "bug", "internal_error") == [
        Fail("bug", code="internal_error")
    ]
