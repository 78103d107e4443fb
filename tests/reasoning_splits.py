"""Tokenizations of a thinking model's output with its markers split every way.

Shared by the core, server and SDK tests of reasoning (the S28 case): each
marker, together with a multi-byte character written next to it, is cut into
two or three tokens at every byte position; the rest of the text is one token
per character. Cuts inside a character's UTF-8 bytes are included.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

__all__ = ["MARKERS", "S28", "S28_WIDE", "marker_splits"]

S28 = "<think>plan: 2+2=4</think>The answer is 4."
"""The shared case's output: reasoning ``plan: 2+2=4``, content
``The answer is 4.``"""

S28_WIDE = "<think>plan: 2+2≈4€</think>€The answer is 4 ≈."
"""The same with a three-byte character on each side of the end marker."""

MARKERS = ("<think>", "</think>")


def _cuts(region: bytes) -> Iterator[list[bytes]]:
    """``region`` in two or three non-empty pieces, every way."""
    for k in (1, 2):
        for at in itertools.combinations(range(1, len(region)), k):
            bounds = (0, *at, len(region))
            yield [region[a:b] for a, b in itertools.pairwise(bounds)]


def _regions(text: str) -> list[tuple[bool, str]]:
    """``text`` as (is a marker region, text) pieces: a marker region is a
    marker with the non-ASCII characters right next to it."""
    pieces: list[tuple[bool, str]] = []
    rest = text
    while rest:
        at, marker = (
            min((rest.find(m), m) for m in MARKERS if m in rest)
            if any(m in rest for m in MARKERS)
            else (-1, "")
        )
        if at < 0:
            pieces.append((False, rest))
            break
        start, end = at, at + len(marker)
        while start > 0 and not rest[start - 1].isascii():
            start -= 1
        while end < len(rest) and not rest[end].isascii():
            end += 1
        if start:
            pieces.append((False, rest[:start]))
        pieces.append((True, rest[start:end]))
        rest = rest[end:]
    return pieces


def marker_splits(text: str) -> Iterator[list[bytes]]:
    """Every tokenization of ``text`` (as byte pieces) in which each marker
    region is cut into two or three tokens at every position, one at a time
    (the other regions cut in the middle); other text is one token per
    character."""
    regions = _regions(text)
    marked = [i for i, (is_marker, _) in enumerate(regions) if is_marker]
    for varied in marked:
        data = regions[varied][1].encode()
        for cut in _cuts(data):
            tokens: list[bytes] = []
            for i, (is_marker, piece) in enumerate(regions):
                raw = piece.encode()
                if i == varied:
                    tokens += cut
                elif is_marker:
                    half = len(raw) // 2
                    tokens += [raw[:half], raw[half:]]
                else:
                    tokens += [c.encode() for c in piece]
            assert b"".join(tokens) == text.encode()
            yield tokens
