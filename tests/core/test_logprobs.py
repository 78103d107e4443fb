"""LogprobAligner cuts text at token ends; the two OpenAI logprobs shapes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.decoding.choice import ChoiceDecoder
from sluicegate.core.decoding.detokenize import IncrementalDetokenizer
from sluicegate.core.decoding.stops import StopMatcher
from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.logprobs import (
    AlignedStep,
    LogprobAligner,
    LogprobToken,
    TopLogprob,
    chat_logprobs,
    completion_logprobs,
    describe_token,
)

PIECES = [b"<eos>", b"Hel", b"lo", b" \xe6\x97", b"\xa5", b" AB", b"CD", b"E"]
EOS = 0


def _run(
    token_ids: list[int], stops: tuple[str, ...] = (), *, include: bool = False
) -> list[AlignedStep[int]]:
    """Decode like the server does: one token at a time, then flush."""
    detokenizer = IncrementalDetokenizer(PIECES, frozenset({EOS}))
    decoder = ChoiceDecoder(
        detokenizer, StopMatcher(stops, include_stop_str_in_output=include)
    )
    aligner = LogprobAligner[int]()
    steps, released = [], 0
    for token_id in token_ids:
        step = decoder.feed((token_id,))
        released += len(step.text)
        end = released + len(decoder.held)
        incomplete = detokenizer.pending_bytes or step.finish_reason is not None
        steps.append(aligner.feed(step.text, token_id, None if incomplete else end))
        if step.finish_reason is not None:
            steps.append(aligner.flush())
            return steps
    steps.append(aligner.flush(decoder.flush().text))
    return steps


def _joined_bytes(step: AlignedStep[int]) -> bytes:
    return b"".join(PIECES[t] for t, _ in step.tokens)


def test_a_character_split_across_tokens_goes_out_with_both_tokens() -> None:
    steps = _run([1, 2, 3, 4, EOS])
    assert [(s.text, [t for t, _ in s.tokens]) for s in steps] == [
        ("Hel", [1]),
        ("lo", [2]),
        ("", []),
        (" 日", [3, 4]),
        ("", []),
        ("", []),  # the end-of-sequence token has no text: dropped
    ]
    assert [start for s in steps for _, start in s.tokens] == [0, 3, 5, 5]


def test_text_held_by_the_stop_matcher_waits_for_its_token() -> None:
    steps = _run([5, 6, 1], stops=("ABX",))
    assert [(s.text, [t for t, _ in s.tokens]) for s in steps] == [
        ("", []),
        (" ABCD", [5, 6]),
        ("Hel", [1]),
        ("", []),
    ]
    for step in steps:
        assert _joined_bytes(step) == step.text.encode()


def test_tokens_inside_a_cut_stop_string_are_dropped() -> None:
    steps = _run([1, 5, 6, 7], stops=("ABCDE",))
    assert [(s.text, [t for t, _ in s.tokens]) for s in steps] == [
        ("Hel", [1]),
        ("", []),
        ("", []),
        ("", []),
        # " AB" starts before the cut: reported whole (documented divergence).
        (" ", [5]),
    ]


def test_with_the_stop_string_in_the_output_every_token_is_kept() -> None:
    steps = _run([1, 5, 6, 7], stops=("ABCDE",), include=True)
    assert "".join(s.text for s in steps) == "Hel ABCDE"
    assert [t for s in steps for t, _ in s.tokens] == [1, 5, 6, 7]


def test_an_incomplete_character_at_the_end_is_flushed_with_its_token() -> None:
    steps = _run([1, 3])
    assert steps[-1].text == " \ufffd"
    assert [t for t, _ in steps[-1].tokens] == [3]


@given(st.lists(st.integers(0, len(PIECES) - 1), max_size=12))
def test_alignment_never_loses_text_or_reorders_tokens(token_ids: list[int]) -> None:
    steps = _run(token_ids, stops=("CDE", "lo H"))
    decoder = ChoiceDecoder(
        IncrementalDetokenizer(PIECES, frozenset({EOS})), StopMatcher(("CDE", "lo H"))
    )
    expected = "".join(decoder.feed((t,)).text for t in token_ids)
    if not decoder.finished:
        expected += decoder.flush().text
    assert "".join(s.text for s in steps) == expected
    reported = [t for s in steps for t, _ in s.tokens]
    assert reported == token_ids[: len(reported)]
    starts = [start for s in steps for _, start in s.tokens]
    assert starts == sorted(starts)


def test_misuse_raises_and_changes_nothing() -> None:
    aligner = LogprobAligner[int]()
    aligner.feed("ab", 1, 2)
    with pytest.raises(LocalProtocolError, match="must not decrease; got 1 after 2"):
        aligner.feed("", 2, 1)
    assert aligner.flush() == AlignedStep("", ())
    with pytest.raises(LocalProtocolError, match=r"feed\(\) after flush"):
        aligner.feed("", 3, 3)
    with pytest.raises(LocalProtocolError, match="called twice"):
        aligner.flush()


def test_describe_token_escapes_partial_characters() -> None:
    assert describe_token(PIECES, 1) == ("Hel", b"Hel")
    assert describe_token(PIECES, 4) == ("\\xa5", b"\xa5")


TOKENS = [
    LogprobToken("Hel", b"Hel", -0.5, 0, (TopLogprob("Hel", b"Hel", -0.5),)),
    LogprobToken("lo", b"lo", -1.0, 3, (TopLogprob("la", b"la", -0.25),)),
]


def test_chat_logprobs_shape() -> None:
    assert chat_logprobs(TOKENS) == {
        "content": [
            {
                "token": "Hel",
                "logprob": -0.5,
                "bytes": [72, 101, 108],
                "top_logprobs": [
                    {"token": "Hel", "logprob": -0.5, "bytes": [72, 101, 108]}
                ],
            },
            {
                "token": "lo",
                "logprob": -1.0,
                "bytes": [108, 111],
                "top_logprobs": [{"token": "la", "logprob": -0.25, "bytes": [108, 97]}],
            },
        ],
        "refusal": None,
    }


def test_completion_logprobs_shape_includes_the_sampled_token_in_top() -> None:
    assert completion_logprobs(TOKENS) == {
        "tokens": ["Hel", "lo"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": [{"Hel": -0.5}, {"la": -0.25, "lo": -1.0}],
        "text_offset": [0, 3],
    }
