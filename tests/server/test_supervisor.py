"""WorkerSupervisor with real child processes that exit at once: restarts
until the budget's limit, then it gives up and exits 1; ``--workers`` values."""

from __future__ import annotations

import os
import sys

import pytest

from sluicegate.core.restarts import RestartBudget
from sluicegate.server.supervisor import WorkerSupervisor
from sluicegate.server.workers import parse_workers, worker_count

EXIT_3 = [sys.executable, "-c", "import sys; sys.exit(3)"]


def _budget() -> RestartBudget:
    return RestartBudget(base_s=0.01, max_s=0.01, limit=2, window_s=60.0)


def test_a_worker_that_keeps_dying_is_restarted_up_to_the_limit() -> None:
    # fd 0 stands for the listening socket: the child gets --listen-fd 0
    supervisor = WorkerSupervisor(EXIT_3, [0], {}, budget=_budget)
    assert supervisor.run() == 1
    (slot,) = supervisor.workers
    assert slot.exits == [3, 3, 3]  # the first start, then two restarts


def test_an_engine_process_that_keeps_dying_stops_the_workers_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = WorkerSupervisor(
        sleeper, [0], {}, engine_command=EXIT_3, budget=_budget
    )
    assert supervisor.run() == 1
    assert supervisor.engine is not None
    assert supervisor.engine.exits == [3, 3, 3]
    (worker,) = supervisor.workers
    assert worker.exits == [-15]  # stopped by the supervisor's SIGTERM
    assert "engine process exited with 3; restart limit reached" in caplog.text


def test_workers_is_a_count_from_one_or_auto() -> None:
    assert parse_workers("3") == 3
    assert worker_count(parse_workers("auto")) == len(os.sched_getaffinity(0))
    for bad in ("0", "-1"):
        with pytest.raises(ValueError, match="auto or an integer >= 1"):
            parse_workers(bad)
