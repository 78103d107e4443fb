"""A GGUF vocabulary's pieces kept on disk, so a start-up reads them in one go.

Reading Gemma 3's 262,144 pieces through llama.cpp takes three foreign calls a
token (about 0.6 s on this project's 2-core machine, three times that under a
line tracer); the file written here is read back in tens of milliseconds. It
lives in ``$SLUICEGATE_HOME/vocab/`` under a name that hashes the model file's
resolved path, size and modification time and the llama.cpp binding's version,
so a changed model or binding is read afresh. The format is plain data (no
pickle): a file that fails any check is ignored and rewritten.

Layout, little-endian: the magic ``SGVOCAB1``; four ``uint64`` (token count,
special count, stop count, blob bytes); ``count + 1`` ``uint32`` offsets into
the blob; the special ids and the stop ids as ``int32``; the blob of every
piece's bytes in id order.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import sys
import tempfile
from array import array
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CachedVocab", "cache_path", "read", "write"]

_MAGIC = b"SGVOCAB1"
_HEAD = struct.Struct("<8sQQQQ")


@dataclass(frozen=True, slots=True)
class CachedVocab:
    """What a vocabulary read needs: every piece, the control and end ids."""

    pieces: tuple[bytes, ...]
    special: frozenset[int]
    stop: frozenset[int]


def cache_path(model: Path, binding: str, root: Path) -> Path:
    """The cache file of ``model`` read by llama.cpp binding version ``binding``.

    Raises:
        OSError: ``model`` cannot be stat'ed.
    """
    resolved = model.resolve()
    stat = resolved.stat()
    key = f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}\0{binding}\0{_MAGIC!r}"
    name = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    return root / "vocab" / f"{name}.bin"


def _ints(kind: str, data: bytes) -> array[int]:
    values = array(kind)
    values.frombytes(data)
    if (
        sys.byteorder != "little"
    ):  # pragma: no cover - the project's machines are little-endian
        values.byteswap()
    return values


def read(path: Path, n_tokens: int) -> CachedVocab | None:
    """The vocabulary in ``path``, or ``None`` when it is absent, unreadable,
    not this format, truncated, inconsistent or not of ``n_tokens`` tokens."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < _HEAD.size:
        return None
    magic, count, n_special, n_stop, blob_bytes = _HEAD.unpack_from(data)
    offsets_at = _HEAD.size
    ids_at = offsets_at + 4 * (count + 1)
    blob_at = ids_at + 4 * (n_special + n_stop)
    if magic != _MAGIC or count != n_tokens or len(data) != blob_at + blob_bytes:
        return None
    offsets = _ints("I", data[offsets_at:ids_at])
    ids = _ints("i", data[ids_at:blob_at])
    if offsets[0] != 0 or offsets[-1] != blob_bytes:
        return None
    if any(not 0 <= token < count for token in ids):
        return None
    blob = data[blob_at:]
    pieces = tuple([blob[offsets[i] : offsets[i + 1]] for i in range(count)])
    # Offsets that ever go down slice more bytes than the blob holds, in all.
    if sum(map(len, pieces)) != blob_bytes:
        return None
    return CachedVocab(pieces, frozenset(ids[:n_special]), frozenset(ids[n_special:]))


def write(path: Path, vocab: CachedVocab) -> None:
    """Write ``vocab`` to ``path`` atomically (a temporary file, then a
    rename); a failure to write (a read-only data dir) is ignored: the cache
    only saves time."""
    offsets = array("I", [0])
    total = 0
    for piece in vocab.pieces:
        total += len(piece)
        offsets.append(total)
    ids = array("i", [*sorted(vocab.special), *sorted(vocab.stop)])
    if sys.byteorder != "little":  # pragma: no cover - see _ints
        offsets.byteswap()
        ids.byteswap()
    head = _HEAD.pack(
        _MAGIC, len(vocab.pieces), len(vocab.special), len(vocab.stop), total
    )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".vocab-")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(head)
            out.write(offsets.tobytes())
            out.write(ids.tobytes())
            out.write(b"".join(vocab.pieces))
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
