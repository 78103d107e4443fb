"""RestartBudget: back-off doubling after short lives, reset after a healthy
run, and a limit over a sliding window that, once reached, stays reached.
StuckWatch: a child with no beat in time, or busy without progress, is stuck;
one that is starting, idle or progressing is not."""

import pytest

from sluicegate.core.restarts import Beat, RestartBudget, StuckWatch


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


def test_a_child_is_not_judged_before_its_first_beat() -> None:
    watch = StuckWatch(heartbeat_s=1.0, step_deadline_s=5.0)
    assert [watch.feed(t, None) for t in (0.0, 100.0, 1000.0)] == [None] * 3
    assert watch.feed(1000.0, Beat(0, 0, busy=True)) is None  # armed now


def test_a_child_whose_beats_stop_is_stuck_once_the_heartbeat_passes() -> None:
    watch = StuckWatch(heartbeat_s=1.0, step_deadline_s=5.0)
    beat = Beat(7, 3, busy=False)
    assert watch.feed(0.0, beat) is None
    assert watch.feed(0.99, beat) is None  # the same beat: stopped, or slow
    assert watch.feed(0.99, None) is None  # unreadable: no news
    assert watch.feed(0.99, Beat(7, 4, busy=False)) is None  # same tick: no beat
    stuck = watch.feed(1.0, beat)
    assert stuck is not None
    assert stuck.startswith("no heartbeat for 1.0 s")


def test_a_busy_child_without_progress_is_stuck_at_the_step_deadline() -> None:
    watch = StuckWatch(heartbeat_s=1.0, step_deadline_s=5.0)
    assert watch.feed(0.0, Beat(0, 10, busy=True)) is None
    verdicts = [watch.feed(t / 2, Beat(t, 10, busy=True)) for t in range(1, 11)]
    assert verdicts[:-1] == [None] * 9  # beating, but no step ends
    assert verdicts[-1] is not None
    assert verdicts[-1].startswith("busy without progress for 5.0 s")


def test_progress_or_idleness_keeps_a_beating_child_live() -> None:
    watch = StuckWatch(heartbeat_s=1.0, step_deadline_s=5.0)
    for t in range(100):  # a step every beat
        assert watch.feed(float(t) / 2, Beat(t, t, busy=True)) is None
    for t in range(100, 200):  # idle: nothing to progress on
        assert watch.feed(float(t) / 2, Beat(t, 99, busy=False)) is None
    # busy again: the deadline counts from the last idle beat (at 99.5 s)
    assert watch.feed(100.0, Beat(200, 99, busy=True)) is None
    assert watch.feed(104.0, Beat(208, 99, busy=True)) is None
    assert watch.feed(104.5, Beat(209, 99, busy=True)) is not None
