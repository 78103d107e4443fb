"""Shared Hypothesis strategies and helpers for the core tests."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, TypeVar, overload

from hypothesis import strategies as st

from sluicegate.core.decoding.reasoning_parsers import ReasoningParser

T = TypeVar("T", str, bytes)
U = TypeVar("U")


@overload
def split_at(seq: str, cuts: Sequence[int]) -> list[str]: ...
@overload
def split_at(seq: bytes, cuts: Sequence[int]) -> list[bytes]: ...
@overload
def split_at(seq: Sequence[U], cuts: Sequence[int]) -> list[Sequence[U]]: ...
def split_at(seq: Sequence[Any], cuts: Sequence[int]) -> list[Any]:
    """``seq`` cut at each offset in ``cuts`` (any order, duplicates give empties)."""
    bounds = [0, *sorted(min(max(c, 0), len(seq)) for c in cuts), len(seq)]
    return [seq[a:b] for a, b in itertools.pairwise(bounds)]


def every_split(seq: T) -> list[list[T]]:
    """``seq`` in two parts at every offset, then one element at a time."""
    splits = [[seq[:i], seq[i:]] for i in range(len(seq) + 1)]
    splits.append([seq[i : i + 1] for i in range(len(seq))])
    return splits


def partitions(seq: Sequence[U]) -> st.SearchStrategy[list[Sequence[U]]]:
    """Any partition of ``seq`` into consecutive parts (empty parts included)."""
    return st.lists(st.integers(0, len(seq)), max_size=len(seq) + 2).map(
        lambda cuts: split_at(seq, cuts)
    )


# Text that exercises line ends, multi-byte characters and look-alike separators.
tricky_text = st.lists(
    st.one_of(
        st.sampled_from(
            ["\r", "\n", "\r\n", "\u2028", "\u2029", "\x00", "\x85", "\ufeff", ":", " "]
        ),
        st.sampled_from(["a", "é", "€", "日", "🤖", "data: ", "[DONE]", "event: x"]),
        st.characters(exclude_categories=["Cs"]),
    ),
    max_size=30,
).map("".join)


def reference_split(text: str, parser: ReasoningParser) -> tuple[str, str, bool, int]:
    """(reasoning, content, ended, chars up to the end of the end marker or of the
    text when it never ends), by whole-string search: an independent oracle."""
    if not parser.end:
        return "", text, False, 0
    if parser.start and text.startswith(parser.start):
        offset = len(parser.start)
    elif parser.starts_inside:
        offset = 0
    else:
        return "", text, False, 0
    reasoning, marker, content = text[offset:].partition(parser.end)
    spent = offset + len(reasoning) + len(marker) if marker else len(text)
    return reasoning, content, bool(marker), spent
