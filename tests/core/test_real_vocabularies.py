"""The detokenizer invariant on real vocabularies.

For any token sequence and any split of it into ``feed`` calls, everything emitted
plus ``flush()`` equals the tokenizer's own full decode. Sequences mix random ids
(any piece, special tokens included), byte tokens (which split characters), and
the tokens of real text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.decoding.reasoning import ReasoningSplitter
from sluicegate.core.decoding.reasoning_parsers import reasoning_parser

from .strategies import reference_split, split_at

REAL_VOCAB = settings(
    max_examples=60, suppress_health_check=[HealthCheck.too_slow], deadline=None
)
text_for_tokenizers = st.text(
    alphabet=st.one_of(
        st.sampled_from(list("é€日本🤖 \n\t  ab")),
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=20,
)


def _ids(
    data: st.DataObject,
    size: int,
    byte_ids: Sequence[int],
    encode: Callable[[str], list[int]],
) -> list[int]:
    """Random ids, byte ids, and the ids of a random text, mixed in runs."""
    runs = data.draw(
        st.lists(
            st.one_of(
                st.lists(st.integers(0, size - 1), max_size=4),
                st.lists(st.sampled_from(byte_ids), max_size=4),
                text_for_tokenizers.map(encode),
            ),
            max_size=4,
        )
    )
    return [token for run in runs for token in run]


def _run(detok: IncrementalDetokenizer | WindowedDetokenizer, parts: Any) -> str:
    return "".join(detok.feed(part) for part in parts) + detok.flush()


def _byte_ids(pieces: Sequence[bytes]) -> list[int]:
    return [i for i, p in enumerate(pieces) if len(p) == 1 and p[0] >= 0x80]


# --- Tekken (tiktoken-style byte-level BPE, mistral-common) -------------------------


@REAL_VOCAB
@given(data=st.data())
def test_tekken_incremental_any_split_gives_the_full_decode(
    tekken: Any, data: st.DataObject
) -> None:
    vocab = tekken
    ids = _ids(data, len(vocab.pieces), _byte_ids(vocab.pieces), vocab.encode)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    detok = IncrementalDetokenizer(vocab.pieces, skip_ids=vocab.special_ids)
    assert _run(detok, split_at(ids, cuts)) == vocab.decode(ids)


@REAL_VOCAB
@given(data=st.data())
def test_tekken_windowed_any_split_gives_the_full_decode(
    tekken: Any, data: st.DataObject
) -> None:
    vocab = tekken
    ids = _ids(data, len(vocab.pieces), _byte_ids(vocab.pieces), vocab.encode)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    detok = WindowedDetokenizer(vocab.decode, skip_ids=vocab.special_ids)
    assert _run(detok, split_at(ids, cuts)) == vocab.decode(ids)


@REAL_VOCAB
@given(text=text_for_tokenizers)
def test_tekken_tokens_of_text_fed_one_by_one_give_the_text_back(
    tekken: Any, text: str
) -> None:
    vocab = tekken
    ids = vocab.encode(text)
    detok = IncrementalDetokenizer(vocab.pieces, skip_ids=vocab.special_ids)
    assert _run(detok, [[i] for i in ids]) == text


# --- SentencePiece (neighbour-dependent text, byte fallback) -------------------------


@REAL_VOCAB
@given(data=st.data())
def test_sentencepiece_windowed_any_split_gives_the_full_decode(
    sentencepiece_model: Any, data: st.DataObject
) -> None:
    sp = sentencepiece_model
    size = sp.vocab_size()
    byte_ids = [i for i in range(size) if sp.is_byte(i)]
    control = frozenset(i for i in range(size) if sp.is_control(i))
    ids = _ids(data, size, byte_ids, sp.encode)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))

    def decode(window: Sequence[int]) -> str:
        return str(sp.decode(list(window)))

    detok = WindowedDetokenizer(decode, skip_ids=control)
    assert _run(detok, split_at(ids, cuts)) == decode(
        [i for i in ids if i not in control]
    )


@REAL_VOCAB
@given(text=text_for_tokenizers)
def test_sentencepiece_tokens_of_text_fed_one_by_one_give_the_text_back(
    sentencepiece_model: Any, text: str
) -> None:
    sp = sentencepiece_model
    ids = sp.encode(text)
    detok = WindowedDetokenizer(lambda window: str(sp.decode(list(window))))
    assert _run(detok, [[i] for i in ids]) == sp.decode(ids)


# --- Gemma (GGUF vocabulary, read through llama.cpp) ---------------------------------


@REAL_VOCAB
@given(data=st.data())
def test_gemma_incremental_any_split_gives_the_full_decode(
    gemma_pieces: Sequence[bytes],
    gemma_special_ids: frozenset[int],
    data: st.DataObject,
) -> None:
    pieces = gemma_pieces
    byte_ids = _byte_ids(pieces)
    multibyte_ids = [i for i in range(0, len(pieces), 97) if not pieces[i].isascii()]
    runs = data.draw(
        st.lists(
            st.lists(
                st.one_of(
                    st.integers(0, len(pieces) - 1),
                    st.sampled_from(byte_ids),
                    st.sampled_from(multibyte_ids),
                ),
                max_size=6,
            ),
            max_size=4,
        )
    )
    ids = [token for run in runs for token in run]
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    detok = IncrementalDetokenizer(pieces, skip_ids=gemma_special_ids)
    expected = b"".join(pieces[i] for i in ids if i not in gemma_special_ids)
    assert _run(detok, split_at(ids, cuts)) == expected.decode(errors="replace")


# --- Reasoning markers on Gemma's tokens (detokenizer, then splitter) ----------------

# Gemma spells "<think>" as "<", "think", ">" and "</think>" as "</", "think", ">".
reasoning_pieces = st.lists(
    st.one_of(
        text_for_tokenizers,
        st.sampled_from(["<", "</", "<think", "</think", "think>", ">", "é", "🤖"]),
    ),
    max_size=4,
).map("".join)


@REAL_VOCAB
@given(data=st.data())
def test_gemma_reasoning_split_token_by_token_matches_the_whole_text(
    gemma_pieces: Sequence[bytes],
    gemma_tokenizer: Any,
    data: st.DataObject,
) -> None:
    pieces = gemma_pieces
    byte_id = {p[0]: i for i, p in enumerate(pieces) if len(p) == 1}
    parser = reasoning_parser(data.draw(st.sampled_from(["qwen3", "deepseek_r1"])))
    segments = [
        data.draw(st.sampled_from(["", "<think>"])),
        data.draw(reasoning_pieces),
        data.draw(st.sampled_from(["", "</think>"])),
        data.draw(reasoning_pieces),
    ]
    ids: list[int] = []
    for segment in segments:
        if data.draw(st.booleans(), label="as bytes") and all(
            b in byte_id for b in segment.encode()
        ):
            ids += [byte_id[b] for b in segment.encode()]  # characters split
        else:
            ids += gemma_tokenizer.encode(
                segment, add_special=False, parse_special=False
            )
    text = "".join(segments)
    detok = IncrementalDetokenizer(pieces)
    splitter = ReasoningSplitter(parser)
    reasoning: list[str] = []
    content: list[str] = []
    for token in ids:
        step = splitter.feed(detok.feed([token]))
        reasoning.append(step.reasoning)
        content.append(step.content)
    assert detok.flush() == ""  # the segments are whole characters
    end = splitter.flush()
    expected_reasoning, expected_content, ended, spent_chars = reference_split(
        text, parser
    )
    assert "".join([*reasoning, end.reasoning]) == expected_reasoning
    assert "".join([*content, end.content]) == expected_content
    # Tokens up to and including the one that completes the end marker; all of
    # them when the reasoning never ends.
    spent_bytes = len(text[:spent_chars].encode())
    sizes = [len(pieces[token]) for token in ids]
    expected_tokens = next(
        k for k in range(len(ids) + 1) if sum(sizes[:k]) >= spent_bytes
    )
    if not ended and spent_chars:
        expected_tokens = len(ids)
    assert splitter.reasoning_tokens == expected_tokens
