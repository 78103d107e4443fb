"""RestartBudget: back-off doubling after short lives, reset after a healthy
run, and a limit over a sliding window that, once reached, stays reached."""

import pytest

from sluicegate.core.restarts import RestartBudget


def test_the_delay_doubles_after_short_lives_up_to_the_cap() -> None:
    budget = RestartBudget(base_s=0.5, max_s=3.0, healthy_s=10.0, limit=100)
    delays = [budget.after_exit(now_s=float(i), ran_s=1.0) for i in range(5)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_healthy_run_starts_the_back_off_again() -> None:
    budget = RestartBudget(base_s=0.5, max_s=8.0, healthy_s=10.0, limit=100)
    assert budget.after_exit(0.0, ran_s=1.0) == 0.5
    assert budget.after_exit(1.0, ran_s=1.0) == 1.0
    assert budget.after_exit(50.0, ran_s=40.0) == 0.5


def test_the_limit_counts_restarts_within_the_window_then_gives_up_for_good() -> None:
    budget = RestartBudget(base_s=1.0, max_s=1.0, limit=2, window_s=10.0)
    assert budget.after_exit(0.0, ran_s=0.0) == 1.0
    assert budget.after_exit(2.0, ran_s=1.0) == 1.0
    assert [budget.given_up, budget.after_exit(4.0, ran_s=1.0), budget.given_up] == [
        False,
        None,
        True,
    ]
    assert budget.after_exit(100.0, ran_s=50.0) is None  # and stays so


def test_restarts_older_than_the_window_no_longer_count() -> None:
    budget = RestartBudget(base_s=1.0, max_s=1.0, limit=1, window_s=10.0)
    assert budget.after_exit(0.0, ran_s=0.0) == 1.0
    assert budget.after_exit(11.5, ran_s=10.0) == 1.0  # the first (at 1.0) is out


def test_a_limit_of_zero_never_restarts() -> None:
    assert RestartBudget(limit=0).after_exit(0.0, ran_s=0.0) is None


@pytest.mark.parametrize(
    "fields",
    [{"base_s": 0.0}, {"base_s": 2.0, "max_s": 1.0}, {"limit": -1}, {"window_s": 0.0}],
)
def test_out_of_range_settings_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="expected 0 < base_s"):
        RestartBudget(**fields)  # type: ignore[arg-type]
