from __future__ import annotations

from typing import Any

import pytest

from sluicegate.core.endstate import EndState, classify, classify_body

ERROR = {"message": "boom", "type": "server_error", "param": None, "code": None}


@pytest.mark.parametrize(
    ("status", "finished", "n", "done", "error", "gone", "expected"),
    [
        (429, 0, 1, False, None, False, EndState.REJECTED),
        (503, 0, 1, False, ERROR, True, EndState.REJECTED),
        (200, 0, 1, False, ERROR, False, EndState.ERRORED),
        (200, 1, 1, True, ERROR, False, EndState.ERRORED),
        (200, 1, 1, True, None, False, EndState.FINISHED),
        (200, 2, 2, True, None, True, EndState.FINISHED),
        (200, 1, 2, True, None, False, EndState.TRUNCATED),
        (200, 1, 1, False, None, False, EndState.TRUNCATED),
        (200, 0, 1, False, None, True, EndState.ABORTED),
        (200, 1, 1, False, None, True, EndState.ABORTED),
        (None, 0, 1, False, None, False, EndState.TRUNCATED),
        (None, 0, 1, False, None, True, EndState.ABORTED),
    ],
)
def test_classify_first_rule_that_holds_wins(
    status: int | None,
    finished: int,
    n: int,
    done: bool,
    error: dict[str, Any] | None,
    gone: bool,
    expected: EndState,
) -> None:
    assert classify(status, finished, n, done, error, gone) is expected


def test_classify_defaults_to_client_still_there() -> None:
    assert classify(200, 0, 1, False, None) is EndState.TRUNCATED


@pytest.mark.parametrize(("finished", "n"), [(0, 0), (-1, 1)])
def test_classify_rejects_impossible_counts(finished: int, n: int) -> None:
    with pytest.raises(ValueError, match="n >= 1"):
        classify(200, finished, n, False, None)


def test_end_states_are_wire_strings() -> None:
    assert [s.value for s in EndState] == [
        "rejected",
        "finished",
        "errored",
        "aborted",
        "truncated",
    ]


@pytest.mark.parametrize(
    ("client_gone", "failed", "written", "state"),
    [
        (False, False, True, EndState.FINISHED),
        (False, True, True, EndState.ERRORED),
        (True, False, False, EndState.ABORTED),
        (True, True, False, EndState.ABORTED),  # gone first: nothing was answered
        (False, False, False, EndState.ABORTED),  # the body did not go out
        (False, True, False, EndState.ABORTED),
    ],
)
def test_a_json_body_is_classified_by_its_own_rule(
    client_gone: bool, failed: bool, written: bool, state: EndState
) -> None:
    assert classify_body(client_gone, failed, written) is state
