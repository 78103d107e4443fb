"""The table of upstream answers: every status, every ``code``, every
``Retry-After`` gets a bounded, documented answer."""

from __future__ import annotations

import email.utils

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sluicegate.core.upstream.hop_answers import (
    MAX_RETRY_AFTER_S,
    STATUS_ANSWERS,
    Fault,
    HopAnswer,
    answer_of_status,
    retry_after_s,
    status_of_code,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("status", "answer"),
    [
        (400, HopAnswer(400, Fault.CLIENT)),
        (422, HopAnswer(400, Fault.CLIENT)),
        (413, HopAnswer(413, Fault.CLIENT)),
        (429, HopAnswer(503, Fault.OVERLOADED)),
        (503, HopAnswer(503, Fault.OVERLOADED)),
        (504, HopAnswer(504, Fault.TIMEOUT)),
        (401, HopAnswer(502, Fault.SETUP)),
        (403, HopAnswer(502, Fault.SETUP)),
        (404, HopAnswer(502, Fault.SETUP)),
        (405, HopAnswer(502, Fault.SETUP)),
        (407, HopAnswer(502, Fault.SETUP)),
        (418, HopAnswer(502, Fault.SETUP)),
        (408, HopAnswer(502, Fault.BROKEN)),
        (500, HopAnswer(502, Fault.BROKEN)),
        (501, HopAnswer(502, Fault.BROKEN)),
        (599, HopAnswer(502, Fault.BROKEN)),
        (100, HopAnswer(502, Fault.BROKEN)),
        (101, HopAnswer(502, Fault.BROKEN)),
        (200, HopAnswer(502, Fault.BROKEN)),
        (204, HopAnswer(502, Fault.BROKEN)),
        (301, HopAnswer(502, Fault.REDIRECT)),
        (302, HopAnswer(502, Fault.REDIRECT)),
        (303, HopAnswer(502, Fault.REDIRECT)),
        (307, HopAnswer(502, Fault.REDIRECT)),
        (308, HopAnswer(502, Fault.REDIRECT)),
        (0, HopAnswer(502, Fault.BROKEN)),
        (999, HopAnswer(502, Fault.BROKEN)),
        (-1, HopAnswer(502, Fault.BROKEN)),
    ],
)
def test_each_status_has_its_answer(status: int, answer: HopAnswer) -> None:
    assert answer_of_status(status) == answer


@given(st.integers())
def test_no_status_passes_through_unless_it_is_the_clients(status: int) -> None:
    answer = answer_of_status(status)
    assert answer.status in (400, 413, 502, 503, 504)
    assert (answer.fault is Fault.CLIENT) == (status in (400, 413, 422))


def test_the_faults_say_whether_to_fail_over_and_to_count_a_failure() -> None:
    assert [f for f in Fault if f.retry_elsewhere] == [
        Fault.OVERLOADED,
        Fault.TIMEOUT,
        Fault.BROKEN,
        Fault.REDIRECT,
    ]
    assert [f for f in Fault if f.failed] == [
        Fault.TIMEOUT,
        Fault.BROKEN,
        Fault.REDIRECT,
    ]
    assert set(STATUS_ANSWERS) == {400, 408, 413, 422, 429, 503, 504}


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (503, 503),
        ("503", 503),
        ("400", 400),
        (100, 100),
        (599, 599),
        (99, None),
        (600, None),
        ("099", None),
        ("600", None),
        ("⁵⁰³", None),  # Unicode digits that int() rejects
        ("\uff15\uff10\uff13", None),  # full-width digits that int() accepts
        ("503 ", None),
        ("5030", None),
        (503.0, None),
        (True, None),
        (10**400, None),
        (None, None),
        ({"status": 503}, None),
        ([503], None),
        ("rate_limited", None),
    ],
)
def test_only_a_status_is_read_as_one(code: object, status: int | None) -> None:
    assert status_of_code(code) == status


@given(st.one_of(st.text(max_size=8), st.integers(), st.floats(), st.none()))
def test_any_code_is_a_status_or_none(code: object) -> None:
    status = status_of_code(code)
    assert status is None or 100 <= status <= 599


def http_date(offset_s: float) -> str:
    return email.utils.formatdate(NOW + offset_s, usegmt=True)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("7", 7.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        ("3600", 3600.0),
        ("3601", MAX_RETRY_AFTER_S),
        ("1000000000", MAX_RETRY_AFTER_S),
        ("9" * 5000, MAX_RETRY_AFTER_S),  # never int()'d
        ("-1", None),
        ("1.5", None),
        ("1e3", None),
        ("inf", None),
        ("nan", None),
        ("٣", None),
        ("", None),
        ("soon", None),
        (http_date(120), 120.0),
        (http_date(-120), 0.0),
        (http_date(10**7), MAX_RETRY_AFTER_S),
        ("Fri, 31 Dec 9999 23:59:59 -0000", MAX_RETRY_AFTER_S),  # no zone: UTC
        ("Sun, 06 Nov 1994 08:49:37 +9999", None),  # no such zone
        ("Sun, 99 Nov 1994 08:49:37 GMT", None),
    ],
)
def test_retry_after_is_read_safely_and_clamped(
    value: str | None, seconds: float | None
) -> None:
    assert retry_after_s(value, NOW) == seconds


@given(st.text(max_size=40))
def test_any_retry_after_is_none_or_within_an_hour(value: str) -> None:
    seconds = retry_after_s(value, NOW)
    assert seconds is None or 0 <= seconds <= MAX_RETRY_AFTER_S
