"""Toy vocabularies shared by the core tests."""

from __future__ import annotations

from collections.abc import Sequence

# The lesson's toy vocabulary: "é" (C3 A9) and "€" (E2 82 AC) split across tokens.
TOY = (
    b"",
    b"Caf",
    b"\xc3",
    b"\xa9",
    b" costs",
    b" 5",
    b"\xe2\x82",
    b"\xac",
    b".\n",
    b"##",
    b"#",
    b"END",
    b" more",
)
BOS, EOS = 13, 14
TOY_WITH_SPECIALS = (*TOY, b"<bos>", b"<eos>")


# A SentencePiece-like toy: "▁" is a space, "<0xNN>" pieces are raw bytes (byte
# fallback), and decode drops the one leading space of the text, so a token's text
# depends on whether it comes first.
SP_PIECES = (
    "<s>",
    "</s>",
    "▁Hello",
    "▁world",
    "!",
    "▁",
    "<0xC3>",
    "<0xA9>",
    "caf",
    "<0xE2>",
    "<0x82>",
    "<0xAC>",
    "▁▁",
    "\ufffd",
)
SP_SPECIAL = frozenset({0, 1})


def sp_decode(ids: Sequence[int]) -> str:
    out = bytearray()
    for i in ids:
        piece = SP_PIECES[i]
        if i in SP_SPECIAL:
            continue
        if piece.startswith("<0x"):
            out.append(int(piece[3:5], 16))
        else:
            out += piece.replace("▁", " ").encode()
    text = out.decode(errors="replace")
    return text[1:] if text.startswith(" ") else text
