"""Real vocabularies for the core's property tests.

- Tekken (mistral-common ships its JSON files): byte pieces for
  ``IncrementalDetokenizer`` and a ``decode`` function for ``WindowedDetokenizer``.
- A SentencePiece model (mistral-common ships ``.model`` files), decoded by the
  ``sentencepiece`` package when it is installed.
- Gemma's GGUF vocabulary, read through llama.cpp.

Each fixture is session-scoped: the files are parsed once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class ByteVocabulary:
    """Byte pieces indexed by token id, the special ids, and the reference codec."""

    pieces: Sequence[bytes]
    special_ids: frozenset[int]
    decode: Callable[[Sequence[int]], str]
    encode: Callable[[str], list[int]]


def _mistral_data() -> Path:
    mistral_common = pytest.importorskip("mistral_common")
    return Path(mistral_common.__file__).parent / "data"


@pytest.fixture(scope="session")
def tekken() -> ByteVocabulary:
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tokenizer: Any = Tekkenizer.from_file(_mistral_data() / "tekken_240911.json")
    size = tokenizer.n_words
    special = frozenset(range(tokenizer.num_special_tokens))
    pieces = [
        b"" if i in special else tokenizer.id_to_byte_piece(i, SpecialTokenPolicy.KEEP)
        for i in range(size)
    ]

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), SpecialTokenPolicy.IGNORE))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, bos=False, eos=False))

    return ByteVocabulary(pieces, special, decode, encode)


@pytest.fixture(scope="session")
def sentencepiece_model() -> Any:
    sentencepiece = pytest.importorskip(
        "sentencepiece", reason="the sentencepiece package is not installed"
    )
    path = _mistral_data() / "mistral_instruct_tokenizer_240323.model.v3"
    return sentencepiece.SentencePieceProcessor(model_file=str(path))


@pytest.fixture(scope="session")
def gemma_tokenizer() -> Any:
    pytest.importorskip(
        "llama_cpp",
        reason="llama-cpp-python is not installed; Gemma's vocabulary is read with it",
    )
    from sluicegate.engines.llamacpp.engine import load_vocab
    from sluicegate.model import default_model_path

    return load_vocab(default_model_path())


@pytest.fixture(scope="session")
def gemma_pieces(gemma_tokenizer: Any) -> Sequence[bytes]:
    """Gemma's piece bytes, indexed by token id."""
    pieces: Sequence[bytes] = gemma_tokenizer.pieces
    return pieces


@pytest.fixture(scope="session")
def gemma_special_ids(gemma_tokenizer: Any) -> frozenset[int]:
    """Gemma's control tokens (never content)."""
    special: frozenset[int] = gemma_tokenizer.special_ids
    return special
