"""``ledger_values``: what a ledger row may hold, and what it holds instead."""

from __future__ import annotations

import json
import math

import pytest

from sluicegate.server.ledger.values import (
    MAX_COUNT,
    MAX_TEXT_CHARS,
    count,
    describe,
    plain,
    repair,
    when,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (MAX_COUNT, MAX_COUNT),
        (MAX_COUNT + 1, MAX_COUNT),
        pytest.param(10**5000, MAX_COUNT, id="5000-digits"),
        (-1, 0),
        (True, 1),
        (7.9, 7),
        (-3.5, 0),
        (1e300, MAX_COUNT),
        (math.nan, 0),
        (math.inf, 0),
        ("12", 0),
        (None, 0),
    ],
)
def test_count_is_an_int_a_ledger_column_holds(value: object, expected: int) -> None:
    assert count(value) == expected
    assert type(count(value)) is int


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, 1.5),
        (7, 7),
        (2**55 + 1, float(2**55)),
        (10**400, None),
        (-(10**400), None),
        (1e300, 1e300),
        (math.nan, None),
        (-math.inf, None),
        ("1.0", None),
        (None, None),
    ],
)
def test_when_is_a_finite_time_or_none(value: object, expected: object) -> None:
    assert when(value) == expected


def test_a_storable_row_changes_nothing() -> None:
    fields = {
        "request_id": "chatcmpl-1",
        "model": None,
        "status": 200,
        "first_token_at": None,
        "received_at": 1.0,
        "ended_at": 2,
        "finish_reasons": object(),  # not checked here
    }
    assert repair(fields) == ({}, [])


def test_each_value_no_database_stores_is_replaced_and_said() -> None:
    changed, problems = repair(
        {
            "prompt_tokens": 2**64,
            "resumed": 1.0,
            "ended_at": math.nan,
            "first_token_at": math.inf,
            "endpoint": None,
            "key_id": 42,
            "model": "a\x00b\udc80?" + "é" * MAX_TEXT_CHARS,
        }
    )
    assert changed["prompt_tokens"] == MAX_COUNT
    assert changed["resumed"] == 1
    assert isinstance(changed["ended_at"], float)
    assert math.isfinite(changed["ended_at"])
    assert changed["first_token_at"] is None
    assert changed["endpoint"] == "None"
    assert changed["key_id"] == "42"
    model = changed["model"]
    assert model == "a\ufffdb\ufffd?" + "é" * (MAX_TEXT_CHARS - 5)
    assert len(problems) == len(changed)
    assert problems[0] == (
        "prompt_tokens 18446744073709551616 written as 9223372036854775807"
    )
    assert all(len(problem) < 300 for problem in problems)


def test_plain_values_go_into_a_json_line_as_they_are_others_described() -> None:
    huge = "x" * (MAX_TEXT_CHARS + 1)
    values = [None, True, 3, 1.5, "k\ud800", 2**64, math.nan, huge, {"a": 1}, b"\x00"]
    line = json.dumps(plain(values))
    assert json.loads(line) == [
        None,
        True,
        3,
        1.5,
        "k\ud800",
        "18446744073709551616",
        "nan",
        describe(huge),
        "{'a': 1}",
        "b'\\x00'",
    ]
    assert len(describe(huge)) < 100
    assert describe(10**5000) == "<an integer of 16610 bits>"
