from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.reasoning import (
    ReasoningPhase,
    ReasoningSplitter,
    ReasoningStep,
)
from sluicegate.core.decoding.reasoning_parsers import (
    REASONING_PARSERS,
    ReasoningParser,
    detect_reasoning_parser,
    opened_by_prompt,
    reasoning_parser,
)
from sluicegate.core.errors import LocalProtocolError

from .strategies import every_split, reference_split, split_at

QWEN3 = reasoning_parser("qwen3")
R1 = reasoning_parser("deepseek_r1")
NONE = reasoning_parser("none")
START, REASONING, CONTENT = (
    ReasoningPhase.START,
    ReasoningPhase.REASONING,
    ReasoningPhase.CONTENT,
)
S28 = "<think>plan: 2+2=4</think>The answer is 4."


def run(splitter: ReasoningSplitter, parts: Sequence[str]) -> tuple[str, str]:
    """Feed ``parts``, checking the step order and the holdback bound on the way."""
    reasoning: list[str] = []
    content: list[str] = []
    for part in parts:
        step = splitter.feed(part)
        if any(content):
            assert step.reasoning == ""  # no reasoning after content
        reasoning.append(step.reasoning)
        content.append(step.content)
        assert step.phase is splitter.phase
        assert len(splitter.held) < max(len(QWEN3.start), len(QWEN3.end))
    last = splitter.flush()
    assert splitter.held == ""
    return "".join([*reasoning, last.reasoning]), "".join([*content, last.content])


# --- examples ---------------------------------------------------------------------


def test_markers_split_across_pieces_are_held_and_dropped() -> None:
    splitter = ReasoningSplitter(QWEN3)
    steps = []
    for piece in ["<th", "ink>plan: 2+2", "=4</thi", "nk>The answer", " is 4."]:
        step = splitter.feed(piece)
        steps.append((step, splitter.held, splitter.reasoning_tokens))
    assert steps == [
        (ReasoningStep("", "", START), "<th", 0),
        (ReasoningStep("plan: 2+2", "", REASONING), "", 2),
        (ReasoningStep("=4", "", REASONING), "</thi", 3),
        (ReasoningStep("", "The answer", CONTENT), "", 4),
        (ReasoningStep("", " is 4.", CONTENT), "", 4),
    ]
    assert splitter.flush() == ReasoningStep("", "", CONTENT)


def test_look_alike_of_the_end_marker_is_released_when_ruled_out() -> None:
    splitter = ReasoningSplitter(R1)
    assert splitter.feed("a </th") == ReasoningStep("a ", "", REASONING)
    assert splitter.held == "</th"
    assert splitter.feed("ese") == ReasoningStep("</these", "", REASONING)
    assert splitter.held == ""
    # Only the longest suffix that is a prefix of the marker is held.
    assert splitter.feed("<<</") == ReasoningStep("<<", "", REASONING)
    assert splitter.held == "</"
    assert splitter.feed("<") == ReasoningStep("</", "", REASONING)
    assert splitter.held == "<"


def test_look_alike_of_the_start_marker_is_content_when_ruled_out() -> None:
    splitter = ReasoningSplitter(QWEN3)
    assert splitter.feed("<thi") == ReasoningStep("", "", START)
    assert splitter.feed("s</think>") == ReasoningStep("", "<this</think>", CONTENT)
    assert splitter.reasoning_tokens == 0
    assert splitter.flush() == ReasoningStep("", "", CONTENT)
    assert splitter.reasoning_tokens == 0


def test_start_marker_counts_only_at_the_very_start() -> None:
    splitter = ReasoningSplitter(QWEN3)
    assert splitter.feed(" <think>x</think>y") == ReasoningStep(
        "", " <think>x</think>y", CONTENT
    )


def test_later_markers_are_content_verbatim() -> None:
    splitter = ReasoningSplitter(QWEN3)
    step = splitter.feed("<think>a</think>b<think>c</think>d")
    assert step == ReasoningStep("a", "b<think>c</think>d", CONTENT)
    assert splitter.feed("</thi") == ReasoningStep("", "</thi", CONTENT)


def test_template_opened_reasoning_needs_no_start_marker() -> None:
    splitter = ReasoningSplitter(R1)
    assert splitter.phase is START
    assert splitter.feed("\nplan") == ReasoningStep("\nplan", "", REASONING)
    assert splitter.feed("</think>\n\nAnswer") == ReasoningStep(
        "", "\n\nAnswer", CONTENT
    )
    assert splitter.reasoning_tokens == 2


def test_start_marker_written_again_inside_is_dropped() -> None:
    splitter = ReasoningSplitter(R1)
    assert run(splitter, ["<th", "ink>\nplan</think>\n\nok"]) == ("\nplan", "\n\nok")


def test_end_marker_first_when_the_template_opened_reasoning() -> None:
    splitter = ReasoningSplitter(R1)
    assert splitter.feed("</") == ReasoningStep("", "", REASONING)
    assert splitter.held == "</"
    assert splitter.feed("think>ok") == ReasoningStep("", "ok", CONTENT)
    assert splitter.reasoning_tokens == 2


def test_without_reasoning_everything_is_content_at_once() -> None:
    splitter = ReasoningSplitter(NONE)
    assert splitter.phase is CONTENT
    assert splitter.feed("<think>") == ReasoningStep("", "<think>", CONTENT)
    assert splitter.feed("a</think>") == ReasoningStep("", "a</think>", CONTENT)
    assert splitter.reasoning_tokens == 0
    assert splitter.flush() == ReasoningStep("", "", CONTENT)


def test_a_parser_without_start_marker_starts_inside() -> None:
    parser = ReasoningParser("bare", "", "[/R]", starts_inside=True)
    splitter = ReasoningSplitter(parser)
    assert splitter.phase is REASONING
    assert run(splitter, ["x[/", "R]y"]) == ("x", "y")


def test_per_request_override_of_starts_inside() -> None:
    opened = ReasoningSplitter(QWEN3, starts_inside=True)
    assert opened.parser.starts_inside
    assert run(opened, ["plan</think>ok"]) == ("plan", "ok")
    closed = ReasoningSplitter(R1, starts_inside=False)
    assert run(closed, ["plan</think>ok"]) == ("", "plan</think>ok")
    same = ReasoningSplitter(R1, starts_inside=True)
    assert same.parser is R1
    with pytest.raises(ValueError, match="end marker"):
        ReasoningSplitter(NONE, starts_inside=True)


def test_flush_releases_a_partial_end_marker_as_reasoning() -> None:
    splitter = ReasoningSplitter(QWEN3)
    assert splitter.feed("<think>plan</thi") == ReasoningStep("plan", "", REASONING)
    assert splitter.flush() == ReasoningStep("</thi", "", REASONING)
    assert splitter.reasoning_tokens == 1


def test_flush_releases_a_partial_start_marker_to_its_channel() -> None:
    qwen = ReasoningSplitter(QWEN3)
    qwen.feed("<thi")
    assert qwen.flush() == ReasoningStep("", "<thi", CONTENT)
    assert qwen.reasoning_tokens == 0
    r1 = ReasoningSplitter(R1)
    r1.feed("<thi")
    r1.feed("")
    assert r1.reasoning_tokens == 0  # not decided yet
    assert r1.flush() == ReasoningStep("<thi", "", REASONING)
    assert r1.reasoning_tokens == 2


def test_empty_feeds_count_as_tokens_inside_reasoning() -> None:
    splitter = ReasoningSplitter(QWEN3)
    assert splitter.feed("") == ReasoningStep("", "", START)
    for piece in ["<think>", "", "a", "</think>", "", "b"]:
        splitter.feed(piece)
    assert splitter.reasoning_tokens == 5  # up to and including "</think>"


def test_feed_after_flush_and_flush_twice_raise_and_change_nothing() -> None:
    splitter = ReasoningSplitter(QWEN3)
    splitter.feed("<think>a</th")
    splitter.flush()
    with pytest.raises(LocalProtocolError, match=r"feed\(\) after flush"):
        splitter.feed("ink>")
    with pytest.raises(LocalProtocolError, match="called twice"):
        splitter.flush()
    assert (splitter.phase, splitter.held, splitter.reasoning_tokens) == (
        REASONING,
        "",
        1,
    )


def test_parser_table() -> None:
    assert set(REASONING_PARSERS) == {"deepseek_r1", "qwen3", "none"}
    for name, parser in REASONING_PARSERS.items():
        assert parser.name == name
    assert (R1.start, R1.end, R1.starts_inside) == ("<think>", "</think>", True)
    assert (QWEN3.start, QWEN3.end, QWEN3.starts_inside) == (
        "<think>",
        "</think>",
        False,
    )
    assert R1.reasons
    assert QWEN3.reasons
    assert not NONE.reasons
    with pytest.raises(KeyError, match=r"deepseek_r1, none, qwen3\); got 'r2'"):
        reasoning_parser("r2")


def test_parser_markers_that_cannot_describe_a_block_are_refused() -> None:
    with pytest.raises(ValueError, match="end marker"):
        ReasoningParser("x", "<t>", "", starts_inside=False)
    with pytest.raises(ValueError, match="start marker or starts_inside"):
        ReasoningParser("x", "", "</t>", starts_inside=False)


# --- every split of the acceptance text --------------------------------------------

# S28's text, and the same with multi-byte characters against each marker.
SPEC_TEXTS = [
    (S28, "plan: 2+2=4", "The answer is 4."),
    (
        "<think>é plan: 2+2=4 🤖</think>日 The answer is 4. €",
        "é plan: 2+2=4 🤖",
        "日 The answer is 4. €",
    ),
]


@pytest.mark.parametrize(("text", "reasoning", "content"), SPEC_TEXTS)
@pytest.mark.parametrize("parser", [QWEN3, R1])
def test_every_split_gives_the_same_split(
    text: str, reasoning: str, content: str, parser: ReasoningParser
) -> None:
    for parts in every_split(text):
        assert run(ReasoningSplitter(parser), parts) == (reasoning, content)


@pytest.mark.parametrize(("text", "reasoning", "content"), SPEC_TEXTS)
def test_every_byte_split_through_the_detokenizer(
    text: str, reasoning: str, content: str
) -> None:
    """One token per byte: markers and multi-byte characters split every way; a
    token counts as reasoning up to and including the one ending the end marker."""
    data = text.encode()
    byte_pieces = [bytes([b]) for b in range(256)]
    marker_end = data.index(b"</think>") + len(b"</think>")

    def split(tokens: Sequence[bytes]) -> tuple[str, str]:
        detok = IncrementalDetokenizer(byte_pieces)
        texts = [detok.feed(list(token)) for token in tokens]
        return run(ReasoningSplitter(QWEN3), [*texts, detok.flush()])

    for first in range(len(data) + 1):
        for second in range(first, len(data) + 1):
            parts = [data[:first], data[first:second], data[second:]]
            assert split(parts) == (reasoning, content)
    assert split([data[i : i + 1] for i in range(len(data))]) == (reasoning, content)
    splitter = ReasoningSplitter(QWEN3)
    detok = IncrementalDetokenizer(byte_pieces)
    for byte in data:
        splitter.feed(detok.feed([byte]))
    assert splitter.reasoning_tokens == marker_end


# --- properties ---------------------------------------------------------------------

# Text dense in markers, their prefixes and look-alikes, and multi-byte characters.
marker_text = st.lists(
    st.one_of(
        st.sampled_from(["<think>", "</think>", "<", "</", "<th", "</thi", "think>"]),
        st.sampled_from(["a", " ", "\n", "é", "🤖", ">", "/", "k"]),
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=16,
).map("".join)
parsers = st.sampled_from([QWEN3, R1, NONE])


@given(text=marker_text, parser=parsers, data=st.data())
def test_any_partition_gives_the_reference_split(
    text: str, parser: ReasoningParser, data: st.DataObject
) -> None:
    parts = split_at(text, data.draw(st.lists(st.integers(0, len(text)))))
    reasoning, content, _, _ = reference_split(text, parser)
    assert run(ReasoningSplitter(parser), parts) == (reasoning, content)


@given(text=marker_text, parser=parsers)
def test_reasoning_markers_and_content_give_the_input_back(
    text: str, parser: ReasoningParser
) -> None:
    reasoning, content = run(ReasoningSplitter(parser), list(text))
    _, _, ended, _ = reference_split(text, parser)
    opened = bool(parser.start) and text.startswith(parser.start) and parser.reasons
    rebuilt = (
        (parser.start if opened else "")
        + reasoning
        + (parser.end if ended else "")
        + content
    )
    assert rebuilt == text


@given(text=marker_text, parser=parsers)
def test_one_character_per_feed_counts_reasoning_exactly(
    text: str, parser: ReasoningParser
) -> None:
    splitter = ReasoningSplitter(parser)
    for char in text:
        splitter.feed(char)
    splitter.flush()
    assert splitter.reasoning_tokens == reference_split(text, parser)[3]


@given(text=marker_text, cut=st.integers(0, 40))
def test_a_stream_cut_anywhere_delivers_all_but_no_whole_marker(
    text: str, cut: int
) -> None:
    """Cut at any position: what was generated arrives, complete markers do not."""
    head = text[:cut]
    reasoning, content = run(ReasoningSplitter(QWEN3), list(head))
    assert (reasoning, content) == reference_split(head, QWEN3)[:2]
    if head.startswith("<think>"):
        assert "</think>" not in reasoning


def _longest_proper_prefix_suffix(text: str, marker: str) -> str:
    for k in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-k:]):
            return text[-k:]
    return ""


@given(text=marker_text, parser=parsers)
def test_held_text_is_exactly_the_longest_tail_that_may_become_the_marker(
    text: str, parser: ReasoningParser
) -> None:
    """Minimal holdback, checked after every character against an oracle."""
    splitter = ReasoningSplitter(parser)
    reasoning = ""
    for end, char in enumerate(text, 1):
        step = splitter.feed(char)
        reasoning += step.reasoning
        if step.phase is START:
            assert splitter.held == text[:end]
            assert parser.start.startswith(text[:end])
        elif step.phase is REASONING:
            expected = _longest_proper_prefix_suffix(
                reasoning + splitter.held, parser.end
            )
            assert splitter.held == expected
        else:
            assert splitter.held == ""


def test_one_character_markers_hold_nothing() -> None:
    parser = ReasoningParser("brackets", "⟨", "⟩", starts_inside=False)
    splitter = ReasoningSplitter(parser)
    assert splitter.feed("⟨") == ReasoningStep("", "", REASONING)
    assert splitter.feed("ab") == ReasoningStep("ab", "", REASONING)
    assert splitter.held == ""
    assert splitter.feed("c⟩d⟨") == ReasoningStep("c", "d⟨", CONTENT)


# --- choosing the parser from the template and the prompt --------------------------

# The shape of Qwen3's template: earlier reasoning stripped from the history, an
# empty block written when thinking is switched off.
THINK_TEMPLATE = (
    "{%- for m in messages %}{{ m.content.split('</think>')[-1] }}{%- endfor %}"
    "<|im_start|>assistant\n"
    "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}"
)


def test_a_template_naming_both_markers_is_detected() -> None:
    assert detect_reasoning_parser(THINK_TEMPLATE) is QWEN3
    assert detect_reasoning_parser("{{ '<think>' }}") is None  # no end marker
    assert detect_reasoning_parser("{{ messages }}") is None
    assert detect_reasoning_parser("") is None
    assert detect_reasoning_parser(None) is None


def test_the_built_in_gemma_template_has_no_reasoning() -> None:
    from sluicegate.server.prepare.templates import GEMMA3_TEMPLATE

    assert detect_reasoning_parser(GEMMA3_TEMPLATE) is None


@pytest.mark.parametrize(
    ("prompt", "opened"),
    [
        ("<|User|>2+2?<|Assistant|><think>\n", True),  # DeepSeek-R1's tail
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # switched off
        ("<|im_start|>assistant\n", None),  # the model decides
        ("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n", None),
    ],
)
def test_the_prompt_tail_says_whether_reasoning_was_opened(
    prompt: str, opened: bool | None
) -> None:
    assert opened_by_prompt(prompt, QWEN3) is opened
    assert opened_by_prompt(prompt, R1) is opened
    assert opened_by_prompt(prompt, NONE) is None
    splitter = ReasoningSplitter(QWEN3, starts_inside=opened)
    expected = ("plan", "ok") if opened else ("", "plan</think>ok")
    assert run(splitter, ["plan</think>ok"]) == expected
