"""The vocabulary cache: what is written is read back, anything else is refused."""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.engines.llamacpp import vocab_cache
from sluicegate.engines.llamacpp.vocab_cache import CachedVocab

SAMPLE = CachedVocab(
    (b"<pad>", b"", b"\xe2\x82", b"\xac", b" the", b"<eos>"),
    frozenset({0, 5}),
    frozenset({5}),
)


@st.composite
def vocabularies(draw: st.DrawFn) -> CachedVocab:
    pieces = tuple(draw(st.lists(st.binary(max_size=12), min_size=1, max_size=40)))
    ids = st.integers(0, len(pieces) - 1)
    return CachedVocab(
        pieces, frozenset(draw(st.sets(ids))), frozenset(draw(st.sets(ids)))
    )


@settings(max_examples=60, deadline=None)
@given(vocab=vocabularies())
def test_what_is_written_is_read_back(vocab: CachedVocab) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vocab" / "v.bin"
        vocab_cache.write(path, vocab)
        assert vocab_cache.read(path, len(vocab.pieces)) == vocab


def _corrupt(data: bytes, kind: str) -> bytes:
    head = struct.calcsize("<8sQQQQ")
    if kind == "magic":
        return b"SGVOCAB0" + data[8:]
    if kind == "truncated":
        return data[:-1]
    if kind == "longer":
        return data + b"x"
    if kind == "offset-down":  # the second offset past the third
        at = head + 4 * 2
        return data[:at] + struct.pack("<I", 9) + data[at + 4 :]
    if kind == "id-out-of-range":
        at = head + 4 * (len(SAMPLE.pieces) + 1)
        return data[:at] + struct.pack("<i", 99) + data[at + 4 :]
    assert kind == "empty"
    return b""


@pytest.mark.parametrize(
    "kind",
    ["magic", "truncated", "longer", "offset-down", "id-out-of-range", "empty"],
)
def test_a_damaged_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "v.bin"
    vocab_cache.write(path, SAMPLE)
    assert vocab_cache.read(path, len(SAMPLE.pieces)) == SAMPLE
    path.write_bytes(_corrupt(path.read_bytes(), kind))
    assert vocab_cache.read(path, len(SAMPLE.pieces)) is None


def test_another_token_count_or_no_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "v.bin"
    assert vocab_cache.read(path, 6) is None
    vocab_cache.write(path, SAMPLE)
    assert vocab_cache.read(path, 7) is None


def test_a_data_dir_that_cannot_be_written_is_no_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    vocab_cache.write(blocker / "vocab" / "v.bin", SAMPLE)
    assert not (blocker / "vocab").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_the_name_follows_the_model_file_and_the_binding(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(8))
    root = tmp_path / "home"
    first = vocab_cache.cache_path(model, "0.3.36", root)
    assert first.parent == root / "vocab"
    assert vocab_cache.cache_path(model, "0.3.36", root) == first
    assert vocab_cache.cache_path(model, "0.3.37", root) != first
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert vocab_cache.cache_path(model, "0.3.36", root) != first


@pytest.mark.llamacpp
def test_the_default_models_vocabulary_from_the_cache_equals_llama_cpps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sluicegate.engines.llamacpp.vocab import LlamaTokenizer, load_vocab
    from sluicegate.model import default_model_path

    model = default_model_path()
    monkeypatch.setenv("SLUICEGATE_HOME", str(tmp_path))
    read = load_vocab(model)  # through llama.cpp, then written
    (written,) = (tmp_path / "vocab").iterdir()

    def no_llama_cpp(self: LlamaTokenizer, n: int) -> CachedVocab:
        raise AssertionError("read through llama.cpp, not the cache")

    monkeypatch.setattr(LlamaTokenizer, "_read_pieces", no_llama_cpp)
    cached = load_vocab(model)
    assert cached.pieces == read.pieces
    assert len(cached.pieces) == 262_144
    assert cached.special_ids == read.special_ids
    assert cached.stop_ids == read.stop_ids
    assert cached.encode("Hi €", add_special=False, parse_special=False) == (
        read.encode("Hi €", add_special=False, parse_special=False)
    )
    assert sorted((tmp_path / "vocab").iterdir()) == [written]
