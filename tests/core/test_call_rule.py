"""CallRule through ResponseDecoder: a text engine's calls held to ``tool_choice``.

A named ``tool_choice`` promises a call of that function: a call of another one
never reaches the client, and its choice fails in band the way a choice that
had to call and answered in words does (``tool_call_missing``).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.deltas import NO_CALL, CallTerms
from sluicegate.core.decoding.response import ChoiceOptions, ResponseDecoder
from sluicegate.core.events import (
    Delta,
    DeltaParts,
    End,
    Fail,
    Finish,
    FinishReason,
    StreamEvent,
    TextOutput,
    ToolCallFragment,
    Usage,
)

from .strategies import partitions

NAMED = CallTerms(most=1, required=True, name="get_weather")
MISSING = "tool_call_missing"


def _decoder(terms: CallTerms = NAMED) -> ResponseDecoder:
    return ResponseDecoder([ChoiceOptions()], None, prompt_tokens=3, calls=terms)


def _step(*fragments: ToolCallFragment, text: str = "") -> TextOutput:
    return TextOutput(text, None, 1, tool_calls=fragments)


def _start(index: int, name: str) -> ToolCallFragment:
    return ToolCallFragment(index, f"call_{index}", name, "")


def test_a_call_of_another_function_never_goes_out_and_fails_naming_both() -> None:
    decoder = _decoder()
    other = _start(0, "get_time")
    events = decoder.feed(
        0, _step(other, ToolCallFragment(0, arguments="{}"), text="I")
    )
    message = "The engine called 'get_time', though tool_choice named 'get_weather'"
    assert events == [Delta(0, "I"), Fail(message, code=MISSING)]
    assert decoder.finish_reasons == (None,)  # no Finish, no End
    assert decoder.feed(0, TextOutput("", FinishReason.TOOL_CALLS, 1)) == ()
    assert decoder.flush() == (0,)  # its engine still runs: the caller aborts it


def test_a_call_of_another_function_fails_even_where_the_token_limit_ends_it() -> None:
    decoder = _decoder()
    last = TextOutput("", FinishReason.LENGTH, 1, tool_calls=(_start(0, "get_time"),))
    (failed,) = decoder.feed(0, last)
    assert isinstance(failed, Fail)
    assert failed.code == MISSING
    assert decoder.flush() == ()  # the engine ended


def test_the_named_function_goes_out_whole_and_a_second_call_cuts_the_choice() -> None:
    decoder = _decoder()
    start, args = _start(0, "get_weather"), ToolCallFragment(0, arguments="{}")
    assert decoder.feed(0, _step(start)) == [Delta(0, "", parts=DeltaParts((start,)))]
    # A second call past the one allowed is cut, whatever it names.
    events = decoder.feed(0, _step(args, _start(1, "get_time")))
    assert events == [
        Delta(0, "", parts=DeltaParts((args,))),
        Finish(0, FinishReason.TOOL_CALLS),
        End(Usage(3, 2)),
    ]
    assert decoder.aborts == [0]


def test_a_named_choice_answered_in_words_fails_naming_the_function() -> None:
    decoder = _decoder()
    assert decoder.feed(0, TextOutput("Hi", None, 1)) == (Delta(0, "Hi"),)
    message = (
        "The engine answered without calling 'get_weather', though tool_choice named it"
    )
    assert decoder.feed(0, TextOutput("", FinishReason.STOP, 1)) == [
        Fail(message, code=MISSING)
    ]
    cut = _decoder()
    assert cut.feed(0, TextOutput("Hi", FinishReason.LENGTH, 1))[-2:] == [
        Finish(0, FinishReason.LENGTH),
        End(Usage(3, 1)),
    ]
    required = _decoder(CallTerms(required=True))
    assert required.feed(0, TextOutput("Hi", FinishReason.STOP, 1)) == [
        Delta(0, "Hi"),
        Fail(NO_CALL, code=MISSING),
    ]


def _fragments(names: Sequence[str]) -> list[ToolCallFragment]:
    """Each call as OpenAI streams it: its start, then its arguments in two."""
    out = []
    for i, name in enumerate(names):
        out += [
            _start(i, name),
            ToolCallFragment(i, arguments='{"a"'),
            ToolCallFragment(i, arguments=": 1}"),
        ]
    return out


@given(
    st.lists(st.sampled_from(["get_weather", "get_time"]), min_size=1, max_size=3)
    .map(_fragments)
    .flatmap(partitions)
)
def test_no_call_but_the_named_one_reaches_the_client_however_it_is_split(
    parts: list[Sequence[ToolCallFragment]],
) -> None:
    decoder = _decoder()
    events: list[StreamEvent] = []
    for part in parts:
        events += decoder.feed(0, _step(*part))
    events += decoder.feed(0, TextOutput("", FinishReason.TOOL_CALLS, 0))
    sent = [
        f
        for e in events
        if isinstance(e, Delta) and e.parts
        for f in e.parts.tool_calls
    ]
    fragments = [f for part in parts for f in part]
    first = fragments[0].name
    if first == "get_weather":  # that call whole, then the choice ends
        assert sent == [f for f in fragments if f.index == 0]
        assert isinstance(events[-2], Finish)
        assert events[-2].finish_reason is FinishReason.TOOL_CALLS
    else:  # nothing of it; one error naming it
        assert sent == []
        assert events[-1] == Fail(
            f"The engine called {first!r}, though tool_choice named 'get_weather'",
            code=MISSING,
        )
        assert not [e for e in events if isinstance(e, Finish | End)]
