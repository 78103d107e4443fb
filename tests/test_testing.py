"""``sluicegate.testing``: a server subprocess started, waited for and stopped.

The servers here are tiny stand-ins (Python's own ``http.server``, scripts that
exit or never listen), so no test depends on the model or on sluicegate serving.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from sluicegate.testing import ServerNotReady, ServerProcess, free_port, serve_command

GIVE_UP_S = 60.0
"""A liveness deadline only: a child starts in well under a second when idle."""


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_serve_command_runs_this_python_on_the_port() -> None:
    command = serve_command(8123, "--engine", "scripted")
    assert command[0] == sys.executable
    assert command[1:] == [
        "-m",
        "sluicegate",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--engine",
        "scripted",
    ]


def test_a_server_is_ready_once_its_path_answers_200_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    (tmp_path / "health").write_text("ok")
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    log = tmp_path / "server.log"
    with ServerProcess(command, port, log_path=log, cwd=tmp_path) as server:
        server.wait_ready("/health", timeout_s=GIVE_UP_S, interval_s=0.05)
        assert httpx.get(f"{server.base_url}/health").text == "ok"
        assert server.pid == server.process.pid
        status = server.stop()
    assert status in (0, -signal.SIGTERM)
    assert server.stop() == status  # idempotent
    assert "GET /health" in server.log_text()


def test_a_server_that_exits_is_not_ready_and_its_log_says_why(
    tmp_path: Path,
) -> None:
    command = _python("import sys; print('no model here'); sys.exit(3)")
    server = ServerProcess(command, free_port(), log_path=tmp_path / "x.log", name="x")
    with server, pytest.raises(ServerNotReady) as caught:
        server.wait_ready(timeout_s=GIVE_UP_S, interval_s=0.05)
    message = str(caught.value)
    assert message.startswith("x server exited with 3 before /health answered 200")
    assert "no model here" in message


def test_a_silent_server_is_not_ready_after_the_timeout() -> None:
    server = ServerProcess(_python("import time; time.sleep(60)"), free_port())
    with server, pytest.raises(ServerNotReady, match=r"silent 0\.2 s"):
        server.wait_ready("/ready", timeout_s=0.2, interval_s=0.05)
    assert server.log_text() == ""  # no log file was asked for
    assert server.process.returncode == -signal.SIGTERM


def test_stop_kills_a_server_that_ignores_its_signal(tmp_path: Path) -> None:
    code = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ignoring', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "stubborn.log"
    server = ServerProcess(_python(code), free_port(), log_path=log)
    deadline = time.monotonic() + GIVE_UP_S
    while "ignoring" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.stop(timeout_s=0.2) == -signal.SIGKILL
