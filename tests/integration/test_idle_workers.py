"""A worker of ``serve --engine-process --workers 2`` that has served no request.

Each worker holds its connection to the engine process from its start, so
what it says of the engine is the engine's now whether or not it has
streamed: its ``/engine/stats`` and ``/metrics`` count the other worker's
streams, and its ``/ready`` turns 503 while the engine process is away and
200 once it is back.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import ExitStack, closing
from pathlib import Path

import httpx
import pytest

from tests.redis_server import RedisServer
from tests.sse_lines import data_lines

from .servers import ServerProcess
from .wire import engine_stats
from .workers import client_on, engine_pid, eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}


@pytest.fixture
def server(redis_server: RedisServer, tmp_path: Path) -> Iterator[ServerProcess]:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    process = ServerProcess(
        "idle-workers",
        [
            "--engine-process", "--workers", "2", "--redis", redis_server.url,
            "--engine", "scripted", "--scripted-text", str(text),
            "--scripted-rate", "40", "--no-ledger",
        ],
        tmp_path,
    )  # fmt: skip
    with process:
        process.wait_healthy()
        yield process


def _counter(client: httpx.Client, name: str) -> float:
    text = client.get("/metrics").text
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.rsplit(" ", 1)[1])


def test_an_idle_worker_serves_the_engines_stats_and_metrics_of_now(
    server: ServerProcess,
) -> None:
    one, busy_pid = client_on(server.base_url)
    two, _ = client_on(server.base_url, pid=busy_pid)
    idle, _ = client_on(server.base_url, not_pid=busy_pid)
    body = {**CHAT, "max_tokens": 200, "stream": True}  # 5 s each
    with closing(one), closing(two), closing(idle), ExitStack() as stack:
        lines = []
        for busy in (one, two):  # both on one worker: the idle one streams none
            live = stack.enter_context(
                busy.stream("POST", "/v1/chat/completions", json=body)
            )
            lines.append(live.iter_lines())
            assert data_lines(lines[-1], stop_after=2)
        seen: list[int] = []

        def running() -> bool:
            seen.append(engine_stats(idle)["running"])
            return seen[-1] == 2

        assert eventually(running), seen
        assert _counter(idle, "sluicegate_engine_running") == 2
        for each in lines:
            assert data_lines(each)[-1] == "[DONE]"

        def agree() -> bool:  # one engine's counters, whichever worker says
            said = [engine_stats(c)["generated_tokens"] for c in (one, idle)]
            return bool(said[0] == said[1] >= 400)

        assert eventually(agree)
        assert engine_stats(idle)["running"] == 0
        name = "sluicegate_engine_generated_tokens_total"
        assert _counter(idle, name) == _counter(one, name) >= 400


def test_an_idle_worker_is_not_ready_while_the_engine_process_is_away(
    server: ServerProcess,
) -> None:
    first, first_pid = client_on(server.base_url)
    second, _ = client_on(server.base_url, not_pid=first_pid)
    workers = [first, second]
    engine = engine_pid(server.pid)
    assert engine is not None
    for worker in workers:
        assert worker.get("/ready").status_code == 200
    # The supervisor stopped: it cannot restart the engine until SIGCONT, so
    # the test sees the workers while the engine is away, whatever the timing.
    os.kill(server.pid, signal.SIGSTOP)
    try:
        os.kill(engine, signal.SIGKILL)
        for worker in workers:

            def away(worker: httpx.Client = worker) -> bool:
                return bool(worker.get("/ready").status_code == 503)

            assert eventually(away)
            not_ready = worker.get("/ready")
            assert not_ready.json()["error"]["code"] == "engine_unavailable"
            assert worker.get("/health").json()["status"] == "engine_restarting"
    finally:
        os.kill(server.pid, signal.SIGCONT)
    assert eventually(lambda: engine_pid(server.pid) not in (None, engine))
    for worker in workers:

        def ready(worker: httpx.Client = worker) -> bool:
            return bool(worker.get("/ready").status_code == 200)

        assert eventually(ready)
        assert worker.get("/health").json()["status"] == "ok"
        worker.close()
