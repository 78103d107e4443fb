from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding.choice import ChoiceDecoder, ChoiceStep
from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.events import FinishReason

from .strategies import split_at
from .toys import TOY, sp_decode

STOP = FinishReason.STOP
EOS = len(TOY)
PIECES = (*TOY, b"<eos>")


def decoder(stops: list[str], **kwargs: bool) -> ChoiceDecoder:
    return ChoiceDecoder(
        IncrementalDetokenizer(PIECES, skip_ids=frozenset({EOS})),
        StopMatcher(stops, **kwargs),
    )


def test_lesson_tokens_stop_at_the_stop_string() -> None:
    choice = decoder(["###END"])
    steps = [
        (choice.feed([t]), choice.held, choice.completion_tokens) for t in range(1, 12)
    ]
    assert steps == [
        (ChoiceStep("Caf"), "", 1),
        (ChoiceStep(""), "", 2),
        (ChoiceStep("é"), "", 3),
        (ChoiceStep(" costs"), "", 4),
        (ChoiceStep(" 5"), "", 5),
        (ChoiceStep(""), "", 6),
        (ChoiceStep("€"), "", 7),
        (ChoiceStep(".\n"), "", 8),
        (ChoiceStep(""), "##", 9),
        (ChoiceStep(""), "###", 10),
        (ChoiceStep("", STOP), "", 11),
    ]
    assert choice.finished
    assert choice.stop == "###END"


def test_tokens_after_a_stop_are_discarded_and_not_counted() -> None:
    choice = decoder(["###END"])
    assert choice.feed(range(1, 13)) == ChoiceStep("Café costs 5€.\n", STOP)
    assert choice.completion_tokens == 11
    assert choice.feed([12, 12]) == ChoiceStep("")
    assert choice.completion_tokens == 11
    assert choice.flush() == ChoiceStep("")


def test_without_stop_strings_every_token_is_counted() -> None:
    choice = decoder([])
    assert choice.feed([1, 2]) == ChoiceStep("Caf")
    assert choice.feed(iter([3, EOS])) == ChoiceStep("é")
    assert choice.completion_tokens == 4
    assert not choice.finished
    assert choice.stop is None
    assert choice.flush() == ChoiceStep("")


def test_flush_releases_held_text_and_an_incomplete_character() -> None:
    choice = decoder(["###END"])
    assert choice.feed([1, 9, 6]) == ChoiceStep("Caf")
    assert choice.held == "##"
    assert choice.flush() == ChoiceStep("##\ufffd")
    assert not choice.finished


def test_flush_tail_that_completes_a_stop_string_reports_stop() -> None:
    choice = ChoiceDecoder(WindowedDetokenizer(sp_decode), StopMatcher(["caf\ufffd"]))
    assert choice.feed([8, 9]) == ChoiceStep("")
    assert choice.flush() == ChoiceStep("", STOP)
    assert choice.finished


def test_include_stop_str_in_output() -> None:
    choice = decoder(["###END"], include_stop_str_in_output=True)
    assert choice.feed(range(8, 12)) == ChoiceStep(".\n###END", STOP)


def test_feed_and_flush_after_flush_raise() -> None:
    choice = decoder(["x"])
    choice.flush()
    with pytest.raises(LocalProtocolError):
        choice.feed([1])
    with pytest.raises(LocalProtocolError):
        choice.flush()


@settings(max_examples=300)
@given(
    ids=st.lists(st.integers(1, EOS), max_size=20),
    stops=st.lists(
        st.sampled_from(["###END", "#", "é c", "5€", "\n#", "END"]), max_size=2
    ),
    data=st.data(),
)
def test_text_and_count_do_not_depend_on_the_split(
    ids: list[int], stops: list[str], data: st.DataObject
) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))

    def run(parts: list[list[int]]) -> tuple[str, FinishReason | None, int]:
        choice = decoder(stops)
        text, reason = "", None
        for part in parts:
            step = choice.feed(part)
            text += step.text
            reason = reason or step.finish_reason
        last = choice.flush()
        return text + last.text, reason or last.finish_reason, choice.completion_tokens

    one_by_one = run([[t] for t in ids])
    assert run([list(p) for p in split_at(ids, cuts)]) == one_by_one
    assert run([ids]) == one_by_one
    text, reason, count = one_by_one
    full = b"".join(PIECES[t] for t in ids if t != EOS).decode(errors="replace")
    if reason is None:
        assert text == full
        assert count == len(ids)
    else:
        assert full.startswith(text)
