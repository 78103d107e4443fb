"""Real sluicegate servers as subprocesses: start on a free port, wait, stop.

Each server's stdout and stderr go to one log file, which a failing test gets in its
report (see ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

HEALTH_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
"""SIGTERM first; the server's own shutdown grace is 10 s by default."""

N_CTX = 2048
"""KV cells of the llama.cpp test server: small, so that a prompt longer than the
context is cheap to build (S14)."""
PARALLEL = 2


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """``python -m sluicegate serve`` on a free port, its output in a log file."""

    def __init__(self, name: str, extra_args: Sequence[str], log_dir: Path) -> None:
        self.name = name
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = [
            sys.executable,
            "-m",
            "sluicegate",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *extra_args,
        ]
        self.log_path = log_dir / f"{name}-{self.port}.log"
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.args,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_healthy(self) -> None:
        """Poll ``GET /health`` until it says ok; fail with the log if it cannot."""
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        with httpx.Client(base_url=self.base_url, timeout=5) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    pytest.fail(
                        f"{self.name} server exited with {self.process.returncode} "
                        f"before /health said ok: {' '.join(self.args)}\n"
                        f"{self.log_text()}",
                        pytrace=False,
                    )
                try:
                    response = client.get("/health")
                except httpx.TransportError:
                    response = None
                if response is not None and response.status_code == 200:
                    assert response.json() == {"status": "ok"}, response.text
                    return
                time.sleep(0.2)
        pytest.fail(
            f"{self.name} server not healthy after {HEALTH_TIMEOUT_S} s\n"
            f"{self.log_text()}",
            pytrace=False,
        )

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


StartServer = Callable[..., ServerProcess]
"""The ``start_server`` fixture: ``start_server(name, *serve_args)``."""


BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The module ``bench/<name>.py`` (bench/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
