"""Incremental detokenizers: token ids in, complete text out.

Two strategies, one contract. ``IncrementalDetokenizer`` serves byte-piece
vocabularies (GGUF, tiktoken/Tekken), where the text of a sequence is the UTF-8
decoding of its pieces' bytes joined together. ``WindowedDetokenizer`` serves
tokenizers whose text for a token depends on its neighbours (SentencePiece's
``▁``, byte fallback, Hugging Face decoders); it re-decodes a short window of
recent tokens and emits only the new suffix.

Invariants (property-tested on real vocabularies):

- For any token sequence and any split of it into ``feed`` calls,
  ``"".join(feed(...) for ...) + flush()`` equals the full decode of the sequence
  without its ``skip_ids`` tokens (invalid UTF-8 replaced by U+FFFD).
- Special tokens (``skip_ids``) never reach the text.
- ``feed`` never returns half a character. ``IncrementalDetokenizer`` holds at most
  three bytes, and only while they can still complete a character.

Deliberate divergence: CPython's incremental UTF-8 decoder waits for a third byte
after ``ED A0``..``ED BF`` (the encoding of a surrogate, which can never complete);
``IncrementalDetokenizer`` replaces those two bytes with U+FFFD at once, as the
final decode would.

Calling ``feed`` or ``flush`` after ``flush`` raises ``LocalProtocolError``.

Speed: ``IncrementalDetokenizer`` keeps, per vocabulary (by identity) and shared
by all its instances, the text of each piece that decodes on its own to complete
characters. A token fed alone while nothing is pending is then one dict lookup
(``ChoiceDecoder``'s one-token steps; property-tested against the plain path).
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Callable, Iterable, Sequence

from sluicegate.core.errors import LocalProtocolError

__all__ = ["IncrementalDetokenizer", "WindowedDetokenizer"]

_REPLACEMENT = "\ufffd"

# id(pieces) -> (pieces, texts): texts[token_id] is what ``feed((token_id,))``
# returns when nothing is pending, for the ids seen so far whose piece leaves
# nothing pending. Keyed by identity (a vocabulary is a long-lived tuple that
# hashing would walk whole); holding ``pieces`` keeps its id from being reused.
# A few vocabularies at most: the oldest goes first.
_TEXT_TABLES: dict[int, tuple[Sequence[bytes], dict[int, str]]] = {}
_MAX_TEXT_TABLES = 8


def _text_table(pieces: Sequence[bytes]) -> dict[int, str]:
    entry = _TEXT_TABLES.get(id(pieces))
    if entry is not None:
        return entry[1]
    if len(_TEXT_TABLES) >= _MAX_TEXT_TABLES:
        del _TEXT_TABLES[next(iter(_TEXT_TABLES))]
    texts: dict[int, str] = {}
    _TEXT_TABLES[id(pieces)] = (pieces, texts)
    return texts


class IncrementalDetokenizer:
    """Byte-piece vocabularies (GGUF, tiktoken/Tekken): join piece bytes, decode UTF-8.

    Emits only complete characters; a byte sequence that can no longer complete
    becomes U+FFFD at once (never held forever).

    Args:
        pieces: the bytes of every token id's piece, indexed by token id. It is
            kept by reference, not copied, and must not change afterwards (the
            text of its pieces is cached per vocabulary).
        skip_ids: token ids whose pieces are never decoded (BOS, EOS, end of
            turn, other control tokens).
        drop_incomplete_tail: what ``flush()`` does with the first bytes of a
            character that the sequence ended in the middle of (``max_tokens``
            cut a byte-fallback character short): ``False`` returns U+FFFD, as
            a full decode does; ``True`` returns nothing, so that no content
            carries U+FFFD for a character the model never finished. Bytes that
            can never complete still become U+FFFD at once either way.

    Spec: docs/DESIGN.md, "Tokens and text".
    """

    __slots__ = (
        "_closed",
        "_drop_tail",
        "_pending",
        "_pieces",
        "_skip_ids",
        "_texts",
    )

    def __init__(
        self,
        pieces: Sequence[bytes],
        skip_ids: frozenset[int] = frozenset(),
        *,
        drop_incomplete_tail: bool = False,
    ) -> None:
        self._pieces = pieces
        self._skip_ids = skip_ids
        self._drop_tail = drop_incomplete_tail
        # The bytes of an incomplete character. What codecs' incremental UTF-8
        # decoder keeps in its buffer, kept here to call the C decoder directly:
        # its Python wrapper cost more than the decoding, once per token.
        self._pending = b""
        self._closed = False
        self._texts = _text_table(pieces)

    @property
    def pending_bytes(self) -> bytes:
        """Bytes of an incomplete character held back (0 to 3 bytes; not text)."""
        return self._pending

    def feed(self, token_ids: Iterable[int]) -> str:
        """Decode ``token_ids`` and return the text that is now complete.

        Args:
            token_ids: the next token ids of the sequence (any number, in order).

        Returns:
            Complete characters (``str``, possibly empty). Bytes of a character
            that may still complete are kept for the next call; bytes that can no
            longer complete come out as U+FFFD now.

        Raises:
            LocalProtocolError: after ``flush()``.
            ValueError: a token id outside ``0 <= id < len(pieces)``.
        """
        if self._closed:
            raise LocalProtocolError("IncrementalDetokenizer.feed() after flush()")
        pieces = self._pieces
        size = len(pieces)
        skip_ids = self._skip_ids
        data = self._pending
        for token_id in token_ids:
            if not 0 <= token_id < size:
                raise ValueError(
                    f"token id {token_id!r} is outside the vocabulary of {size} pieces"
                )
            if token_id not in skip_ids:
                # One engine step is a few ids: cheaper than a list and a join.
                data += pieces[token_id]
        if data.isascii():
            # Most pieces: complete characters, nothing pending before them.
            self._pending = b""
            return data.decode("ascii")
        text, consumed = utf_8_decode(data, "replace", False)
        pending = data[consumed:]
        if len(pending) == 2 and pending[0] == 0xED and pending[1] >= 0xA0:
            # A surrogate's first two bytes: no third byte can make them valid.
            pending = b""
            text += _REPLACEMENT * 2
        self._pending = pending
        return text

    def _feed_one(self, token_id: int) -> str:
        """``feed((token_id,))``, a dict lookup when nothing is pending: the
        per-token path of ``ChoiceDecoder``.
        """
        if self._pending or self._closed or token_id in self._skip_ids:
            return self.feed((token_id,))
        text = self._texts.get(token_id)
        if text is None:
            text = self.feed((token_id,))
            if not self._pending:
                self._texts[token_id] = text
        return text

    def flush(self) -> str:
        """Return the rest and end the object.

        Returns:
            ``""``, or, for an incomplete character left at the end, U+FFFD
            (``""`` with ``drop_incomplete_tail``).

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("IncrementalDetokenizer.flush() called twice")
        self._closed = True
        pending, self._pending = self._pending, b""
        if self._drop_tail:
            return ""
        text, _ = utf_8_decode(pending, "replace", True)
        return text


class WindowedDetokenizer:
    """Tokenizers whose text depends on neighbours (SentencePiece ``▁``, HF decoders).

    Re-decodes a window from ``prefix_offset`` and emits only the new, complete
    suffix (prefix/read offsets, as vLLM's ``detokenize_incrementally`` and
    Hugging Face's ``DecodeStream`` do). The window keeps the tokens of the last
    emitted step as context, so a tokenizer that strips the leading space of the
    first token strips it from both decodes alike. Text that ends in U+FFFD is held
    until a later token resolves it; ``flush`` emits it as it is.

    Cost per ``feed``: one or two ``decode`` calls over the window (the tokens
    since the last-but-one emission), never over the whole sequence. Only a run
    of tokens whose text keeps ending in U+FFFD (invalid bytes, one after the
    other) widens the window until a token resolves it.

    Args:
        decode: the tokenizer's decode of a list of token ids to text. It must
            give the same text for a window as for that window inside a longer
            sequence once one token of context precedes it (true of
            SentencePiece and byte-level BPE).
        skip_ids: token ids dropped before ``decode`` sees them.
    """

    __slots__ = (
        "_closed",
        "_decode",
        "_prefix_text",
        "_read_offset",
        "_skip_ids",
        "_window",
    )

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        skip_ids: frozenset[int] = frozenset(),
    ) -> None:
        self._decode = decode
        self._skip_ids = skip_ids
        # The window starts at the prefix offset; _read_offset indexes into it.
        self._window: list[int] = []
        self._read_offset = 0
        self._prefix_text = ""
        self._closed = False

    def feed(self, token_ids: Iterable[int]) -> str:
        """Append ``token_ids`` and return the new text that is now safe to emit.

        Args:
            token_ids: the next token ids of the sequence (any number, in order).

        Returns:
            New text (``str``, possibly empty). Empty while the window's text does
            not grow or ends in U+FFFD (an incomplete byte sequence).

        Raises:
            LocalProtocolError: after ``flush()``.
        """
        if self._closed:
            raise LocalProtocolError("WindowedDetokenizer.feed() after flush()")
        before = len(self._window)
        skip = self._skip_ids
        self._window.extend(t for t in token_ids if t not in skip)
        if len(self._window) == before:
            return ""
        text = self._decode(self._window)
        prefix_len = len(self._prefix_text)
        if len(text) <= prefix_len or text.endswith(_REPLACEMENT):
            return ""
        # Advance: the tokens read so far become the context of the next window.
        if self._read_offset:
            del self._window[: self._read_offset]
            self._prefix_text = self._decode(self._window)
        else:
            self._prefix_text = text
        self._read_offset = len(self._window)
        return text[prefix_len:]

    def _feed_one(self, token_id: int) -> str:
        """``feed((token_id,))``: ``ChoiceDecoder`` calls either detokenizer so."""
        return self.feed((token_id,))

    def flush(self) -> str:
        """Return the text still held (it may end in U+FFFD) and end the object.

        Raises:
            LocalProtocolError: called twice.
        """
        if self._closed:
            raise LocalProtocolError("WindowedDetokenizer.flush() called twice")
        self._closed = True
        if len(self._window) == self._read_offset:
            return ""
        return self._decode(self._window)[len(self._prefix_text) :]
