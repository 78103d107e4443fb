"""EventLog: numbered frames handed to the writer, retention and replay."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.errors import LocalProtocolError
from sluicegate.core.event_log import EventLog


def test_frames_are_numbered_from_zero_per_response():
    log = EventLog()
    assert (log.taken_seq, log.appended_seq, len(log)) == (0, 0, 0)
    assert log.append([b"a", b"b"]) == 0
    assert log.append([]) == 2
    assert log.append([b"c"]) == 2
    assert (log.taken_seq, log.appended_seq, len(log)) == (0, 3, 3)
    assert EventLog().append([b"x"]) == 0


def test_take_returns_untaken_frames_in_order_once():
    log = EventLog()
    log.append([b"a", b"b"])
    assert log.take() == [b"a", b"b"]
    assert log.take() == []
    log.append([b"c"])
    assert log.take() == [b"c"]
    assert (log.taken_seq, log.appended_seq, len(log)) == (3, 3, 0)


def test_live_log_keeps_nothing_the_writer_has_taken():
    log = EventLog()
    log.append([b"a"])
    log.take()
    assert len(log) == 0
    assert log.replay(1) == []
    with pytest.raises(LocalProtocolError, match="retained"):
        log.replay(0)


def test_retained_frames_replay_from_a_sequence_number():
    log = EventLog(retain_frames=2)
    assert log.retain_frames == 2
    log.append([b"a", b"b", b"c"])
    log.take()
    log.append([b"d"])
    assert log.replay(1) == [b"b", b"c"]
    assert log.replay(3) == []
    with pytest.raises(LocalProtocolError, match="retained"):
        log.replay(0)
    with pytest.raises(LocalProtocolError, match="taken"):
        log.replay(4)
    assert log.take() == [b"d"]
    assert log.replay(2) == [b"c", b"d"]


def test_negative_retention_is_refused():
    with pytest.raises(ValueError, match="retain_frames"):
        EventLog(-1)
    with pytest.raises(LocalProtocolError):
        EventLog().replay(-1)


@given(
    st.lists(st.lists(st.binary(max_size=3), max_size=4), max_size=8),
    st.lists(st.booleans(), max_size=8),
    st.integers(0, 5),
)
def test_taken_frames_equal_appended_frames_and_retention_is_bounded(
    batches, takes, retain
):
    log = EventLog(retain)
    appended: list[bytes] = []
    taken: list[bytes] = []
    for i, batch in enumerate(batches):
        assert log.append(batch) == len(appended)
        appended += batch
        if i < len(takes) and takes[i]:
            taken += log.take()
        assert len(log) == len(appended) - len(taken)
        assert len(log._retained) <= retain
        if retain == 0:
            assert not log._retained
    taken += log.take()
    assert taken == appended
    start = max(0, len(taken) - retain)
    assert log.replay(start) == taken[start:]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "take", "through"]),
            st.lists(st.binary(max_size=3), max_size=3),
        ),
        max_size=10,
    ),
    st.integers(0, 5),
)
def test_through_is_append_then_take(steps, retain):
    log, twin = EventLog(retain), EventLog(retain)
    for verb, frames in steps:
        if verb == "append":
            assert log.append(frames) == twin.append(frames)
        elif verb == "take":
            assert log.take() == twin.take()
        else:
            twin.append(frames)
            assert log.through(list(frames)) == twin.take()
        assert (log.taken_seq, log.appended_seq) == (twin.taken_seq, twin.appended_seq)
    assert log.replay(max(0, log.taken_seq - retain)) == twin.replay(
        max(0, twin.taken_seq - retain)
    )
