from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.reasoning import ReasoningPhase, ReasoningSplitter
from sluicegate.core.decoding.reasoning_budget import BudgetForcer, ReasoningBudget
from sluicegate.core.decoding.reasoning_parsers import reasoning_parser

R1 = reasoning_parser("deepseek_r1")  # the output begins inside
QWEN3 = reasoning_parser("qwen3")  # the model opens the block itself
END = (70, 71, 72)  # "</", "think", ">" in a toy vocabulary
END_PIECES = {70: b"</", 71: b"think", 72: b">"}


def drive(forcer: BudgetForcer, pieces: Sequence[bytes]) -> list[bytes]:
    """What the sequence becomes: each draw takes the forced token when there
    is one, else the model's next piece."""
    out: list[bytes] = []
    model = iter(pieces)
    forced = forcer.forced
    while True:
        if forced is not None:
            piece = END_PIECES[forced]
        else:
            piece = next(model, b"")
            if not piece:
                return out
        out.append(piece)
        forced = forcer.feed(piece)


def test_the_end_marker_is_forced_at_the_budget_then_nothing() -> None:
    forcer = BudgetForcer(ReasoningBudget(R1, 3), END)
    assert forcer.forced is None
    assert [forcer.feed(p) for p in (b"a", b"b")] == [None, None]
    assert forcer.feed(b"c") == 70  # the next draw's, as forcer.forced says
    assert forcer.feed(b"</") == 71
    assert forcer.feed(b"think") == 72
    assert forcer.feed(b">") is None
    assert forcer.done
    assert [forcer.feed(p) for p in (b"answer", b"</think>", b"more")] == [None] * 3


def test_a_model_that_closes_its_reasoning_first_is_never_forced() -> None:
    forcer = BudgetForcer(ReasoningBudget(R1, 4), END)
    assert drive(forcer, [b"a", b"</thi", b"nk>", b"x", b"y", b"z"]) == [
        b"a",
        b"</thi",
        b"nk>",
        b"x",
        b"y",
        b"z",
    ]
    assert forcer.done


def test_an_output_that_is_content_is_never_forced() -> None:
    forcer = BudgetForcer(ReasoningBudget(QWEN3, 1), END)
    assert drive(forcer, [b"Hi", b" there", b" you"]) == [b"Hi", b" there", b" you"]
    assert forcer.done


def test_a_block_the_model_opens_counts_its_start_marker() -> None:
    forcer = BudgetForcer(ReasoningBudget(QWEN3, 2), END)
    assert drive(forcer, [b"<think>", b"x", b"y"]) == [
        b"<think>",
        b"x",
        b"</",
        b"think",
        b">",
        b"y",
    ]


def test_budget_zero_forces_on_the_first_draw_inside() -> None:
    forcer = BudgetForcer(ReasoningBudget(R1, 0), END)
    assert forcer.forced == 70
    assert drive(forcer, [b"x"]) == [b"</", b"think", b">", b"x"]


def test_forcing_waits_for_a_whole_character() -> None:
    # "日" is three bytes; the budget is reached after its first.
    forcer = BudgetForcer(ReasoningBudget(R1, 1), END)
    assert forcer.feed(b"\xe6") is None
    assert forcer.feed(b"\x97") is None
    assert forcer.feed(b"\xa5") == 70


def test_a_forcer_needs_reasoning_and_an_end_marker() -> None:
    with pytest.raises(ValueError, match="end marker"):
        BudgetForcer(ReasoningBudget(R1, 3), [])
    with pytest.raises(ValueError, match="'none'"):
        BudgetForcer(ReasoningBudget(reasoning_parser("none"), 3), END)


@given(
    budget=st.integers(0, 12),
    inside=st.booleans(),
    words=st.lists(
        st.sampled_from([b"a", b" b", b"<", b"/", b"th", b"\n"]), max_size=30
    ),
)
def test_the_reasoning_ends_at_the_budget_plus_the_marker(
    budget: int, inside: bool, words: list[bytes]
) -> None:
    # The words never spell "</think>": only a forced marker ends the reasoning.
    parser = dataclasses.replace(R1 if inside else QWEN3, starts_inside=inside)
    pieces = words if inside else [b"<think>", *words]
    forcer = BudgetForcer(ReasoningBudget(parser, budget), END)
    out = drive(forcer, pieces)
    splitter = ReasoningSplitter(parser)
    for piece in out:
        splitter.feed(piece.decode())
    at = budget if inside else max(budget, 1)  # the start marker is one token
    if len(pieces) >= at:
        assert out == [*pieces[:at], b"</", b"think", b">", *pieces[at:]]
        assert splitter.phase is ReasoningPhase.CONTENT
        assert splitter.reasoning_tokens == at + len(END)
    else:  # the model stopped before the budget
        assert out == pieces
        splitter.flush()  # the stream ends inside the reasoning
        assert splitter.reasoning_tokens == len(pieces)


def test_gemmas_own_spelling_of_the_end_marker_closes_the_reasoning(
    gemma_tokenizer: Any,
) -> None:
    """Through the real vocabulary and detokenizer, as the server reads them."""
    encode = functools.partial(
        gemma_tokenizer.encode, add_special=False, parse_special=True
    )
    end = encode("</think>")
    said = encode("one two three four five six")
    pieces = gemma_tokenizer.pieces
    forcer = BudgetForcer(ReasoningBudget(R1, 5), end)
    ids: list[int] = []
    model = iter(said)
    forced = forcer.forced
    while (token := next(model, None) if forced is None else forced) is not None:
        ids.append(token)
        forced = forcer.feed(pieces[token])
    assert ids == [*said[:5], *end, *said[5:]]
    detokenizer = IncrementalDetokenizer(pieces)
    splitter = ReasoningSplitter(R1)
    steps = [splitter.feed(detokenizer.feed([token])) for token in ids]
    assert "".join(s.reasoning for s in steps) == detokenizer_text(pieces, said[:5])
    assert "".join(s.content for s in steps) == detokenizer_text(pieces, said[5:])
    assert splitter.reasoning_tokens == 5 + len(end)


def detokenizer_text(pieces: Sequence[bytes], ids: Sequence[int]) -> str:
    return b"".join(pieces[t] for t in ids).decode()
