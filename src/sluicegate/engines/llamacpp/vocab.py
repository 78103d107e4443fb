"""Token ids <-> bytes for a GGUF vocabulary, read through llama.cpp.

A piece is a byte string: Gemma's vocabulary has byte-fallback tokens
(``<0xF0>`` decodes to the single byte ``b"\\xf0"``), so one character can span
several tokens and no piece is decoded to text on its own. Control tokens (BOS,
EOS, end of turn, unused slots) and end-of-generation tokens are ``special_ids``;
they never reach content.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import llama_cpp as llama

from sluicegate.engines.llamacpp import vocab_cache
from sluicegate.model import data_dir

__all__ = ["LlamaTokenizer", "load_vocab", "quiet_logs"]

_PIECE_BUF_BYTES = 256
_META_BUF_BYTES = 1 << 16

_backend_lock = threading.Lock()
_backend_ready = False


def _log_sink(level: int, text: bytes, user_data: Any) -> None:
    # llama.cpp logs every tensor at load time; keep only errors (level 4 = ERROR).
    if level == 4 and text:  # pragma: no cover - only on llama.cpp errors
        import sys

        sys.stderr.write(text.decode("utf-8", "replace"))


_LOG_CALLBACK = llama.llama_log_callback(_log_sink)


def quiet_logs() -> None:
    """Initialise the llama.cpp backend once, with its logging cut to errors."""
    global _backend_ready
    with _backend_lock:
        if not _backend_ready:
            llama.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p())
            llama.llama_backend_init()
            _backend_ready = True


class LlamaTokenizer:
    """The vocabulary of one loaded llama.cpp model.

    Args:
        model: a ``llama_model_p`` that stays alive as long as this object.
        source: the GGUF file ``model`` was loaded from; when given, the
            pieces are read from (and kept in) the vocabulary cache of
            ``vocab_cache`` instead of read through llama.cpp every time.

    Pieces are read once at construction (262,144 for Gemma 3: about 0.6 s
    through llama.cpp, tens of milliseconds from the cache).
    """

    def __init__(self, model: Any, source: Path | None = None) -> None:
        self._model = model
        self._vocab = llama.llama_model_get_vocab(model)
        n = llama.llama_vocab_n_tokens(self._vocab)
        cached = None
        if source is not None:
            path = vocab_cache.cache_path(source, llama.__version__, data_dir())
            cached = vocab_cache.read(path, n)
            if cached is None:
                cached = self._read_pieces(n)
                vocab_cache.write(path, cached)
        else:
            cached = self._read_pieces(n)
        self._pieces = cached.pieces
        self._stop_ids = cached.stop
        self._special_ids = cached.special | cached.stop
        self._bos_id = llama.llama_vocab_bos(self._vocab)
        self._eos_id = llama.llama_vocab_eos(self._vocab)
        self._chat_template = self.metadata("tokenizer.chat_template")

    @property
    def pieces(self) -> Sequence[bytes]:
        """Bytes of every token id's piece; special tokens map to their text."""
        return self._pieces

    @property
    def special_ids(self) -> frozenset[int]:
        """Control and end-of-generation token ids; never part of content."""
        return self._special_ids

    @property
    def stop_ids(self) -> frozenset[int]:
        """End-of-generation token ids (for Gemma 3: ``<eos>``, ``<end_of_turn>``)."""
        return self._stop_ids

    @property
    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template``, or ``None`` if it has none."""
        return self._chat_template

    @property
    def bos_token(self) -> str:
        """Text of the BOS token ("" if the model has none)."""
        return self._text_of(self._bos_id)

    @property
    def eos_token(self) -> str:
        """Text of the EOS token ("" if the model has none)."""
        return self._text_of(self._eos_id)

    @property
    def vocab_size(self) -> int:
        """Number of token ids."""
        return len(self._pieces)

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text``.

        Args:
            text: any str; encoded as UTF-8.
            add_special: prepend BOS where the model is configured to.
            parse_special: turn special-token text (``<start_of_turn>``) into ids.
        """
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (llama.llama_token * capacity)()
            n = llama.llama_tokenize(
                self._vocab, data, len(data), out, capacity, add_special, parse_special
            )
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, or ``None`` when the key is absent."""
        buf = ctypes.create_string_buffer(_META_BUF_BYTES)
        size = llama.llama_model_meta_val_str(
            self._model, key.encode(), buf, _META_BUF_BYTES
        )
        if size < 0:
            return None
        if size >= _META_BUF_BYTES:
            buf = ctypes.create_string_buffer(size + 1)
            llama.llama_model_meta_val_str(self._model, key.encode(), buf, size + 1)
        return buf.value.decode("utf-8", "replace")

    def _read_pieces(self, n: int) -> vocab_cache.CachedVocab:
        """Every piece, the control ids and the end ids, through llama.cpp."""
        buf = ctypes.create_string_buffer(_PIECE_BUF_BYTES)
        pieces: list[bytes] = []
        special: set[int] = set()
        stop: set[int] = set()
        for token in range(n):
            size = llama.llama_token_to_piece(
                self._vocab, token, buf, _PIECE_BUF_BYTES, 0, True
            )
            pieces.append(buf.raw[: max(size, 0)])
            if llama.llama_vocab_is_control(self._vocab, token):
                special.add(token)
            if llama.llama_vocab_is_eog(self._vocab, token):
                stop.add(token)
        return vocab_cache.CachedVocab(
            tuple(pieces), frozenset(special), frozenset(stop)
        )

    def _text_of(self, token: int) -> str:
        if token < 0 or token >= len(self._pieces):
            return ""
        return self._pieces[token].decode("utf-8", "replace")


class _VocabOnly(LlamaTokenizer):
    def __init__(self, path: Path) -> None:
        quiet_logs()
        params = llama.llama_model_default_params()
        params.vocab_only = True
        model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise FileNotFoundError(f"cannot load a GGUF vocabulary from {str(path)!r}")
        super().__init__(model, path)

    def __del__(self) -> None:
        llama.llama_model_free(self._model)


def load_vocab(path: str | Path) -> LlamaTokenizer:
    """Load only the vocabulary of the GGUF file at ``path`` (no weights; fast).

    Raises:
        FileNotFoundError: the file is missing or is not a GGUF model.
    """
    return _VocabOnly(Path(path))
