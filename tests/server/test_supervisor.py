"""WorkerSupervisor with real child processes that exit at once: restarts
until the budget's limit, then it gives up and exits 1; ``--workers`` values;
an engine process that stops beating is killed with SIGKILL and restarted
(its time limit judged on a clock the test moves, not by waiting)."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sluicegate.core.restarts import RestartBudget, StuckWatch
from sluicegate.engines.remote.host import read_beat
from sluicegate.server.app.supervisor import BEAT_READ_S, WorkerSupervisor
from sluicegate.server.app.workers import parse_workers, worker_count, worker_sockets
from sluicegate.server.http.connections import default_max_connections

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


def test_the_parent_sleeps_until_a_child_exits_instead_of_polling() -> None:
    # One child that lives two seconds: the parent looks at its children (and
    # reads the clock) when the child exits and at each beat read, not every
    # 50 ms as it did (20 looks a second, each a wake-up on the engine's cores).
    reads: list[float] = []

    def clock() -> float:
        reads.append(time.monotonic())
        return reads[-1]

    sleeper = [sys.executable, "-c", "import time, sys; time.sleep(2.0); sys.exit(3)"]
    supervisor = WorkerSupervisor(
        sleeper, [0], {}, budget=lambda: RestartBudget(limit=0), clock=clock
    )
    assert supervisor.run() == 1
    (slot,) = supervisor.workers
    assert slot.exits == [3]
    lived_s = reads[-1] - reads[0]
    assert lived_s >= 2.0
    # two reads a look (the child, the sleep), a look a beat read and at the exit
    assert len(reads) <= 3 * (lived_s / BEAT_READ_S + 2), len(reads)


def test_a_child_has_its_own_process_group_in_the_parents_session(
    tmp_path: Path,
) -> None:
    # Its own group: a terminal's Ctrl-C reaches the parent only. The
    # parent's session: the kernel's autogroup schedules them together.
    seen = tmp_path / "ids"
    code = (
        "import os, sys\n"
        "ids = (os.getpid(), os.getpgid(0), os.getsid(0))\n"
        f"open({str(seen)!r}, 'w').write(' '.join(map(str, ids)))\n"
        "sys.exit(3)\n"
    )
    supervisor = WorkerSupervisor(
        [sys.executable, "-c", code], [0], {}, budget=lambda: RestartBudget(limit=0)
    )
    assert supervisor.run() == 1
    pid, group, session = (int(field) for field in seen.read_text().split())
    assert group == pid != os.getpgid(0)
    assert session == os.getsid(0)


def test_workers_is_a_count_from_one_or_auto() -> None:
    assert parse_workers("3") == 3
    assert worker_count(parse_workers("auto")) == len(os.sched_getaffinity(0))
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError, match="auto or an integer >= 1"):
            parse_workers(bad)


def _backlogs(port: int) -> list[int]:
    """The backlog of each socket listening on ``port`` (``ss``'s Send-Q)."""
    shown = subprocess.run(
        ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    return [int(line.split()[2]) for line in shown]


@pytest.mark.skipif(
    shutil.which("ss") is None or not os.path.exists("/proc/sys/net/core/somaxconn"),
    reason="needs Linux's ss to read a listening socket's backlog",
)
@pytest.mark.parametrize("cap", [None, 3000])
def test_each_workers_socket_queues_as_many_connections_as_the_cap(
    cap: int | None,
) -> None:
    """The parent's sockets, which hold the connections of a worker that is
    starting or restarting, queue what one process's does: its connection cap
    (``--max-connections``, else the default), not uvicorn's 2,048."""
    with open("/proc/sys/net/core/somaxconn") as limit:
        somaxconn = int(limit.read())
    args = argparse.Namespace(host="127.0.0.1", port=0, workers=2, max_connections=cap)
    sockets = worker_sockets(args)
    try:
        port = sockets[0].getsockname()[1]
        backlog = max(2048, cap or default_max_connections())
        assert _backlogs(port) == [min(backlog, somaxconn)] * 2
    finally:
        for sock in sockets:
            sock.close()


def _child(mark: str, linger_s: float, log: str) -> list[str]:
    """A child that, on SIGTERM, waits ``linger_s``, appends ``mark`` to
    ``log`` and exits 0 (a worker's drain, an engine's close)."""
    code = (
        "import signal, sys, time\n"
        "def stop(*_):\n"
        f"    time.sleep({linger_s})\n"
        f"    open({log!r}, 'a').write({mark!r})\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({log + '.ready'!r}, 'a').write('r')\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, "-c", code]


def test_a_signal_stops_the_workers_first_and_the_engine_once_they_are_gone(
    tmp_path: Path,
) -> None:
    log = str(tmp_path / "order")
    supervisor = WorkerSupervisor(
        _child("w", 0.3, log),
        [0, 0],
        dict(os.environ),
        engine_command=_child("e", 0.0, log),
        budget=_budget,
    )
    ready = Path(log + ".ready")

    def signal_once_ready() -> None:  # every child has its handler set
        while not ready.exists() or len(ready.read_text()) < 3:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_once_ready, daemon=True).start()
    assert supervisor.run() == 0
    assert Path(log).read_text() == "wwe"  # both workers drained, then the engine


def _draining(log: str) -> list[str]:
    """A worker that drains on SIGTERM and SIGINT (writes ``T``/``I``, goes
    on) and ends on SIGQUIT (writes ``Q``, exits 130, as ``serve`` does after
    a drain begun by SIGINT)."""
    code = (
        "import signal, sys, time\n"
        "def mark(letter):\n"
        f"    open({log!r}, 'a').write(letter)\n"
        "signal.signal(signal.SIGTERM, lambda *_: mark('T'))\n"
        "signal.signal(signal.SIGINT, lambda *_: mark('I'))\n"
        "def end(*_):\n"
        "    mark('Q')\n"
        "    sys.exit(130)\n"
        "signal.signal(signal.SIGQUIT, end)\n"
        f"open({log + '.ready'!r}, 'a').write('r')\n"
        "time.sleep(60)\n"
    )
    return [sys.executable, "-c", code]


def test_a_second_signal_ends_the_drain_with_sigquit_a_repeat_of_sigterm_would_not(
    tmp_path: Path,
) -> None:
    """A worker may have had the signal directly as well (systemd signals every
    process of the service), so it ignores a repeated SIGTERM: the parent's
    first order is SIGTERM, any later one SIGQUIT."""
    log = str(tmp_path / "signals")
    supervisor = WorkerSupervisor(_draining(log), [0], dict(os.environ), budget=_budget)
    ready = Path(log + ".ready")

    def signal_twice() -> None:
        while not ready.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        while not Path(log).exists():  # the worker is draining
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=signal_twice, daemon=True).start()
    assert supervisor.run() == 0  # 130 after a signal: stopped as told
    assert Path(log).read_text() == "TQ"
    assert supervisor.workers[0].exits == [130]


def _beating(beat: Path) -> list[str]:
    """An engine process that is idle and beats every 10 ms, as the host does."""
    code = (
        "import os, sys, time\n"
        "from sluicegate.engines.remote.host import write_beat\n"
        "from sluicegate.engines.values import EngineStats\n"
        "idle = EngineStats(0, 0, 0, 1, 0, 0, 0, 0, 0, 0)\n"
        f"fd = os.open({str(beat)!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
        "for tick in range(100_000):\n"
        "    write_beat(fd, tick, idle)\n"
        "    time.sleep(0.01)\n"
    )
    return [sys.executable, "-c", code]


def test_an_engine_process_that_stops_beating_is_killed_and_restarted(
    tmp_path: Path,
) -> None:
    beat = tmp_path / "engine.sock.beat"
    now = [0.0]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = WorkerSupervisor(
        sleeper,
        [0],
        dict(os.environ),
        engine_command=_beating(beat),
        budget=_budget,
        clock=lambda: now[0],
        engine_beat=beat,
        watch=lambda: StuckWatch(heartbeat_s=5.0, step_deadline_s=60.0),
    )
    engine = supervisor.engine
    assert engine is not None
    seen: list[int] = []

    def stop_the_engine_then_the_supervisor() -> None:
        while engine.process is None or read_beat(beat) is None:
            time.sleep(0.01)  # started, and beating
        seen.append(engine.process.pid)
        os.kill(engine.process.pid, signal.SIGSTOP)  # alive, and not working
        while not engine.kills:  # time passes on the supervisor's clock only
            now[0] += 1.0
            time.sleep(0.06)  # a poll of the supervisor's
        while engine.process is None or engine.process.pid == seen[0]:
            now[0] += 1.0  # past the restart's back-off
            time.sleep(0.06)
        seen.append(engine.process.pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_the_engine_then_the_supervisor, daemon=True).start()
    assert supervisor.run() == 0
    assert engine.exits[0] == -signal.SIGKILL
    assert engine.kills[0].startswith("no heartbeat for ")
    assert len(seen) == 2  # restarted: a new engine process
    assert now[0] >= 5.0  # not before the heartbeat limit


def test_a_port_another_serve_workers_listens_on_is_refused() -> None:
    """A second ``serve --workers`` on a port the first one's ``SO_REUSEPORT``
    sockets listen on fails to bind, as a second single-process ``serve``
    does; it joined their group and took half of their connections."""
    first = worker_sockets(
        argparse.Namespace(host="127.0.0.1", port=0, workers=2, max_connections=None)
    )
    try:
        port = first[0].getsockname()[1]
        again = argparse.Namespace(
            host="127.0.0.1", port=port, workers=2, max_connections=None
        )
        with pytest.raises(OSError, match="in use"):
            worker_sockets(again)
    finally:
        for sock in first:
            sock.close()
    second = worker_sockets(again)  # free again: bound as before
    for sock in second:
        sock.close()
