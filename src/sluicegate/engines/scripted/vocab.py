"""A toy byte-piece vocabulary for the scripted engine and for tests.

``ScriptedTokenizer`` follows the Gemma layout: four special tokens, one token per
byte (so any text encodes, as with byte-fallback vocabularies), and a few
multi-byte pieces, some of which split UTF-8 characters across tokens on purpose,
so that detokenizers and stop matchers meet the hard cases without a real model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["BYTES_START", "ScriptedTokenizer"]

_SPECIALS = (b"<bos>", b"<eos>", b"<start_of_turn>", b"<end_of_turn>")
BYTES_START = len(_SPECIALS)
"""Id of the byte-0x00 token; ids below it are special."""
# Multi-byte pieces. Several cross UTF-8 character boundaries on purpose:
# " \xe6\x97" + "\xa5\xe6\x9c" + "\xac\xe8\xaa\x9e" is " 日本語", and the emoji
# pieces split four-byte characters after one or three bytes.
_WORDS = (
    b"Hello", b"\n\n", b"  ", b"Caf", b"\xc3\xa9", b" \xe6\x97", b"\xa5\xe6\x9c",
    b"\xac\xe8\xaa\x9e", b" \xf0\x9f\x98", b"\x9f\xa6\xa9", b" \xe2\x80\x94",
    b" the", b" The", b" quick", b" brown", b" fox", b" stream", b" tokens",
    b" correct", b"ly", b"user", b"model", b"Hi", b" world", b"ABC", b"DEF",
    b"GHI", b" Alice", b" Bob", b"Once", b" upon", b" a", b" time",
)  # fmt: skip
assert not any(b"<" in w[1:] for w in _WORDS), "a piece over a '<' hides specials"


class ScriptedTokenizer:
    """A toy byte-piece vocabulary: specials, 256 byte tokens, multi-byte pieces.

    Ids 0-3 are ``<bos>``, ``<eos>``, ``<start_of_turn>``, ``<end_of_turn>``; ids
    4-259 are the single bytes 0x00-0xFF; the rest are multi-byte pieces.

    Args:
        chat_template: the Jinja template to report as the model's own, or ``None``
            (the server then uses its built-in Gemma 3 template).
        extra_pieces: more pieces, with ids after the built-in ones, for scripts
            of token ids that cut text in a given way (a marker split across
            tokens); ``encode`` never produces them.

    Attributes:
        bos_id, eos_id, end_of_turn_id: ids of ``<bos>``, ``<eos>`` and
            ``<end_of_turn>`` (``<start_of_turn>`` is 2).
    """

    bos_id = 0
    eos_id = 1
    end_of_turn_id = 3
    _STOP_IDS = frozenset({eos_id, end_of_turn_id})
    _SPECIAL_IDS = frozenset(range(BYTES_START))

    def __init__(
        self, chat_template: str | None = None, extra_pieces: Sequence[bytes] = ()
    ) -> None:
        builtin = (*_SPECIALS, *(bytes([b]) for b in range(256)), *_WORDS)
        self._ids = {piece: i for i, piece in enumerate(builtin)}
        self._pieces = (*builtin, *extra_pieces)
        # Greedy longest piece first, as one regex over the UTF-8 bytes: the
        # alternatives go longest first (the first one that matches at a position
        # is the longest piece there), then any single byte (each is a piece).
        # With parse_special the specials go first; since each starts with "<"
        # and no other piece has a "<" after its first byte, they are tried at
        # every "<" of the text. Runs in C (a chat prompt in ~4 us, not ~27), so
        # that benchmarks of the server through this engine do not count a toy
        # tokenizer's cost as the server's.
        plain = [*map(re.escape, sorted(_WORDS, key=len, reverse=True)), b"."]
        specials = [re.escape(p) for p in _SPECIALS]
        self._plain = re.compile(b"|".join(plain), re.DOTALL)
        self._with_specials = re.compile(b"|".join(specials + plain), re.DOTALL)
        self._chat_template = chat_template

    @property
    def pieces(self) -> Sequence[bytes]:
        """Bytes of every token id's piece (special ids map to their text)."""
        return self._pieces

    @property
    def special_ids(self) -> frozenset[int]:
        """The four control tokens; they never go into content."""
        return self._SPECIAL_IDS

    @property
    def stop_ids(self) -> frozenset[int]:
        """``<eos>`` and ``<end_of_turn>``."""
        return self._STOP_IDS

    @property
    def chat_template(self) -> str | None:
        """The template given to the constructor."""
        return self._chat_template

    @property
    def bos_token(self) -> str:
        """``"<bos>"``."""
        return "<bos>"

    @property
    def eos_token(self) -> str:
        """``"<eos>"``."""
        return "<eos>"

    def encode(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        """Token ids of ``text``: greedy longest piece first, single bytes as fallback.

        Args:
            text: any text (empty gives no ids besides BOS).
            add_special: prepend ``<bos>``.
            parse_special: map the text of the four special tokens to their ids;
                otherwise that text is encoded as plain bytes.

        Returns:
            Token ids; ``decode(encode(t, add_special=False, ...)) == t`` when no
            special text is parsed.
        """
        ids = [self.bos_id] if add_special else []
        greedy = self._with_specials if parse_special else self._plain
        by_piece = self._ids
        ids += [by_piece[piece] for piece in greedy.findall(text.encode("utf-8"))]
        return ids

    def decode(self, token_ids: Iterable[int]) -> str:
        """Text of ``token_ids``, specials skipped, bad UTF-8 as U+FFFD."""
        data = b"".join(self._pieces[i] for i in token_ids if i >= BYTES_START)
        return data.decode("utf-8", errors="replace")
