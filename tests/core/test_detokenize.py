from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluicegate.core.decoding.detokenize import (
    IncrementalDetokenizer,
    WindowedDetokenizer,
)
from sluicegate.core.errors import LocalProtocolError

from .strategies import split_at
from .toys import BOS, EOS, SP_PIECES, SP_SPECIAL, TOY, TOY_WITH_SPECIALS, sp_decode


def _can_complete(pending: bytes) -> bool:
    """Whether ``pending`` is a proper prefix of some valid UTF-8 character."""
    if not pending:
        return True
    try:
        pending.decode()
    except UnicodeDecodeError as exc:
        return exc.reason == "unexpected end of data" and exc.start == 0
    return False


# --- IncrementalDetokenizer: examples ---------------------------------------------


def test_split_characters_are_emitted_once_complete() -> None:
    detok = IncrementalDetokenizer(TOY)
    steps = []
    for token_id in range(1, 13):
        steps.append((detok.feed([token_id]), detok.pending_bytes))
    assert steps == [
        ("Caf", b""),
        ("", b"\xc3"),
        ("é", b""),
        (" costs", b""),
        (" 5", b""),
        ("", b"\xe2\x82"),
        ("€", b""),
        (".\n", b""),
        ("##", b""),
        ("#", b""),
        ("END", b""),
        (" more", b""),
    ]
    assert detok.flush() == ""


def test_feeding_several_tokens_at_once_gives_the_same_text() -> None:
    detok = IncrementalDetokenizer(TOY)
    assert detok.feed([1, 2]) == "Caf"
    assert detok.feed([3, 4, 5, 6]) == "é costs 5"
    assert detok.pending_bytes == b"\xe2\x82"
    assert detok.feed(iter([7, 8])) == "€.\n"


def test_empty_feed_returns_nothing_and_keeps_pending_bytes() -> None:
    detok = IncrementalDetokenizer(TOY)
    assert detok.feed([2]) == ""
    assert detok.feed([]) == ""
    assert detok.pending_bytes == b"\xc3"
    assert detok.feed([3]) == "é"


def test_skip_ids_never_reach_the_text() -> None:
    detok = IncrementalDetokenizer(TOY_WITH_SPECIALS, skip_ids=frozenset({BOS, EOS}))
    assert detok.feed([BOS, 1, 2]) == "Caf"
    assert detok.feed([EOS]) == ""
    assert detok.pending_bytes == b"\xc3"
    assert detok.feed([3, EOS]) == "é"
    assert detok.flush() == ""


def test_special_token_without_skip_ids_is_text() -> None:
    detok = IncrementalDetokenizer(TOY_WITH_SPECIALS)
    assert detok.feed([EOS]) == "<eos>"


def test_incomplete_character_at_flush_becomes_one_replacement_character() -> None:
    detok = IncrementalDetokenizer(TOY)
    assert detok.feed([1, 6]) == "Caf"
    assert detok.flush() == "\ufffd"


def test_incomplete_tail_is_dropped_at_flush_when_asked() -> None:
    detok = IncrementalDetokenizer(TOY, drop_incomplete_tail=True)
    assert detok.feed([1, 6]) == "Caf"
    assert detok.pending_bytes == b"\xe2\x82"
    assert detok.flush() == ""
    assert detok.pending_bytes == b""


def test_dropping_the_tail_still_replaces_bytes_that_cannot_complete() -> None:
    detok = IncrementalDetokenizer(TOY, drop_incomplete_tail=True)
    assert detok.feed([6, 1]) == "\ufffdCaf"  # E2 82 then "C": cannot complete
    assert detok.flush() == ""


@given(
    st.lists(st.integers(0, len(TOY) - 1), max_size=30),
    st.lists(st.integers(0, 30), max_size=5),
)
def test_dropping_the_tail_changes_only_a_trailing_replacement(
    ids: list[int], cuts: list[int]
) -> None:
    keep = IncrementalDetokenizer(TOY)
    drop = IncrementalDetokenizer(TOY, drop_incomplete_tail=True)
    out_keep = "".join(keep.feed(part) for part in split_at(ids, cuts))
    out_drop = "".join(drop.feed(part) for part in split_at(ids, cuts))
    assert out_keep == out_drop
    tail = keep.flush()
    assert tail in ("", "\ufffd")
    assert drop.flush() == ""


def test_sequence_that_cannot_complete_becomes_replacement_at_once() -> None:
    detok = IncrementalDetokenizer(TOY)
    assert detok.feed([6]) == ""
    # "€" needs AC next; "." rules it out, so E2 82 is replaced now, not later.
    assert detok.feed([8]) == "\ufffd.\n"
    assert detok.pending_bytes == b""


def test_lead_byte_after_lead_byte_replaces_the_first_and_holds_the_second() -> None:
    detok = IncrementalDetokenizer((b"\xc3", b"\xe2"))
    assert detok.feed([0]) == ""
    assert detok.feed([1]) == "\ufffd"
    assert detok.pending_bytes == b"\xe2"


def test_invalid_byte_is_replaced_at_once() -> None:
    detok = IncrementalDetokenizer((b"\xff", b"\x80", b"a"))
    assert detok.feed([0]) == "\ufffd"
    assert detok.feed([1, 2]) == "\ufffda"


@pytest.mark.parametrize("second", [0xA0, 0xAF, 0xBF])
def test_surrogate_prefix_is_replaced_at_once(second: int) -> None:
    # CPython's incremental decoder would wait for a third byte here.
    detok = IncrementalDetokenizer((b"\xed", bytes([second]), b"\x80"))
    assert detok.feed([0]) == ""
    assert detok.feed([1]) == "\ufffd\ufffd"
    assert detok.pending_bytes == b""
    assert detok.feed([2]) == "\ufffd"
    assert detok.flush() == ""


def test_valid_character_after_ed_is_held_until_complete() -> None:
    # ED 9F BF is U+D7FF, the last character before the surrogates.
    detok = IncrementalDetokenizer((b"\xed\x9f", b"\xbf"))
    assert detok.feed([0]) == ""
    assert detok.pending_bytes == b"\xed\x9f"
    assert detok.feed([1]) == "\ud7ff"


@pytest.mark.parametrize("token_id", [-1, 13, 10**9])
def test_token_id_outside_vocabulary_raises_and_changes_nothing(token_id: int) -> None:
    detok = IncrementalDetokenizer(TOY)
    detok.feed([2])
    with pytest.raises(ValueError, match=repr(token_id)):
        detok.feed([3, token_id])
    assert detok.pending_bytes == b"\xc3"
    assert detok.feed([3]) == "é"


def test_incremental_feed_after_flush_raises() -> None:
    detok = IncrementalDetokenizer(TOY)
    assert detok.flush() == ""
    with pytest.raises(LocalProtocolError):
        detok.feed([1])
    with pytest.raises(LocalProtocolError):
        detok.flush()


# --- IncrementalDetokenizer: properties -------------------------------------------

byte_pieces = st.lists(st.binary(min_size=0, max_size=4), min_size=1, max_size=12)


@settings(max_examples=300)
@given(pieces=byte_pieces, data=st.data())
def test_any_split_gives_the_full_decode(
    pieces: list[bytes], data: st.DataObject
) -> None:
    ids = data.draw(st.lists(st.integers(0, len(pieces) - 1), max_size=20))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))
    skip = frozenset(data.draw(st.sets(st.integers(0, len(pieces) - 1), max_size=2)))
    detok = IncrementalDetokenizer(pieces, skip_ids=skip)
    out = [detok.feed(part) for part in split_at(ids, cuts)]
    out.append(detok.flush())
    expected = b"".join(pieces[i] for i in ids if i not in skip)
    assert "".join(out) == expected.decode("utf-8", errors="replace")


@settings(max_examples=300)
@given(st.lists(st.binary(min_size=1, max_size=3), max_size=20))
def test_only_completable_bytes_are_ever_held(chunks: list[bytes]) -> None:
    # After every step: emitted text + the pending bytes' final decode equals the
    # decode of everything so far, and the pending bytes can still complete.
    detok = IncrementalDetokenizer(chunks)
    emitted, seen = "", b""
    for token_id, chunk in enumerate(chunks):
        emitted += detok.feed([token_id])
        seen += chunk
        pending = detok.pending_bytes
        assert _can_complete(pending)
        assert len(pending) <= 3
        assert emitted + pending.decode(errors="replace") == seen.decode(
            errors="replace"
        )


# --- WindowedDetokenizer ------------------------------------------------------------


def test_windowed_emits_the_space_that_decoding_alone_would_drop() -> None:
    detok = WindowedDetokenizer(sp_decode, skip_ids=SP_SPECIAL)
    assert detok.feed([0, 2]) == "Hello"
    assert detok.feed([3]) == " world"
    assert detok.feed([3]) == " world"
    assert detok.feed([4]) == "!"
    assert detok.flush() == ""


def test_windowed_holds_text_ending_in_an_incomplete_byte_sequence() -> None:
    detok = WindowedDetokenizer(sp_decode)
    assert detok.feed([8]) == "caf"
    assert detok.feed([6]) == ""
    assert detok.feed([7]) == "é"
    assert detok.feed([5, 9, 10]) == ""
    assert detok.feed([11]) == " €"


def test_windowed_flush_emits_held_replacement_characters() -> None:
    detok = WindowedDetokenizer(sp_decode)
    assert detok.feed([8, 9, 10]) == ""
    assert detok.flush() == "caf\ufffd"


def test_windowed_holds_a_real_replacement_character_until_the_next_token() -> None:
    detok = WindowedDetokenizer(sp_decode)
    assert detok.feed([2, 13]) == ""
    assert detok.feed([4]) == "Hello\ufffd!"


def test_windowed_token_that_adds_no_text_is_held_then_emitted() -> None:
    detok = WindowedDetokenizer(sp_decode)
    assert detok.feed([5]) == ""
    assert detok.feed([5]) == " "
    assert detok.feed([2]) == " Hello"


def test_windowed_only_skip_ids_emit_nothing() -> None:
    detok = WindowedDetokenizer(sp_decode, skip_ids=SP_SPECIAL)
    assert detok.feed([0, 1]) == ""
    assert detok.feed([]) == ""
    assert detok.flush() == ""


def test_windowed_decodes_only_a_short_window() -> None:
    seen: list[int] = []

    def counting_decode(ids: Sequence[int]) -> str:
        seen.append(len(ids))
        return sp_decode(ids)

    detok = WindowedDetokenizer(counting_decode)
    for _ in range(200):
        detok.feed([3])
    assert max(seen) <= 2


def test_windowed_feed_after_flush_raises() -> None:
    detok = WindowedDetokenizer(sp_decode)
    detok.feed([2])
    assert detok.flush() == ""
    with pytest.raises(LocalProtocolError):
        detok.feed([3])
    with pytest.raises(LocalProtocolError):
        detok.flush()


@settings(max_examples=300)
@given(data=st.data())
def test_windowed_any_split_gives_the_full_decode(data: st.DataObject) -> None:
    ids = data.draw(st.lists(st.integers(0, len(SP_PIECES) - 1), max_size=24))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=8))
    detok = WindowedDetokenizer(sp_decode, skip_ids=SP_SPECIAL)
    out = [detok.feed(part) for part in split_at(ids, cuts)]
    out.append(detok.flush())
    assert "".join(out) == sp_decode(ids)


@settings(max_examples=200)
@given(pieces=byte_pieces, data=st.data())
def test_windowed_agrees_with_incremental_on_byte_pieces(
    pieces: list[bytes], data: st.DataObject
) -> None:
    ids = data.draw(st.lists(st.integers(0, len(pieces) - 1), max_size=20))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=6))

    def decode(window: Sequence[int]) -> str:
        return b"".join(pieces[i] for i in window).decode(errors="replace")

    windowed = WindowedDetokenizer(decode)
    incremental = IncrementalDetokenizer(pieces)
    parts = split_at(ids, cuts)
    left = "".join(windowed.feed(p) for p in parts) + windowed.flush()
    right = "".join(incremental.feed(p) for p in parts) + incremental.flush()
    assert left == right == decode(ids)
