"""A server subprocess for tests and benchmarks: start it on a free port, wait until
it answers, stop it.

``ServerProcess`` runs any HTTP server command (``sluicegate serve`` from
``serve_command``, the benchmarks' baseline servers, a peer server) with its
stdout and stderr in one log file, and ``wait_ready`` polls one path until it
answers 200. This is the one copy of that loop for the test suite and
``bench/``; neither runs in production.

Usage::

    port = free_port()
    with ServerProcess(serve_command(port, "--engine", "scripted"), port) as server:
        server.wait_ready()
        httpx.get(f"{server.base_url}/v1/models")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

import httpx

__all__ = ["ServerNotReady", "ServerProcess", "free_port", "serve_command"]

READY_TIMEOUT_S = 120.0
"""How long ``wait_ready`` polls by default: loading the default model on two
busy cores can take tens of seconds."""
STOP_TIMEOUT_S = 15.0
"""How long ``stop`` waits after its signal before it kills; the server's own
shutdown grace is 10 s by default."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(port: int, *args: str, host: str = "127.0.0.1") -> list[str]:
    """``python -m sluicegate serve --host HOST --port PORT *args``, this Python."""
    return [
        sys.executable,
        "-m",
        "sluicegate",
        "serve",
        "--host",
        host,
        "--port",
        str(port),
        *args,
    ]


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer 200, before ``wait_ready`` gave up.

    The message names the command and ends with the server's log.
    """


class ServerProcess:
    """An HTTP server subprocess on ``port``; stopped by ``stop()`` or on exit.

    Args:
        command: the argv to run.
        port: the port the command listens on (see ``free_port``).
        log_path: where stdout and stderr go; ``None`` discards them.
        name: a label for messages.
        host: the address the server listens on.
        env: extra environment variables (``PYTHONUNBUFFERED=1`` is always set).
        cwd: the working directory; ``None`` keeps this process's.
    """

    def __init__(
        self,
        command: Sequence[str],
        port: int,
        *,
        log_path: Path | None = None,
        name: str = "server",
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.command = list(command)
        self.port = port
        self.name = name
        self.base_url = f"http://{host}:{port}"
        self.log_path = log_path
        environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if log_path is None:
            self.process = subprocess.Popen(
                self.command,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=environment,
                cwd=cwd,
            )
        else:
            with log_path.open("wb") as log:
                self.process = subprocess.Popen(
                    self.command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=environment,
                    cwd=cwd,
                )

    @property
    def pid(self) -> int:
        """The subprocess's process id."""
        return self.process.pid

    def log_text(self) -> str:
        """The log so far (``""`` without a log file); undecodable bytes replaced."""
        if self.log_path is None:
            return ""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def wait_ready(
        self,
        path: str = "/health",
        *,
        timeout_s: float = READY_TIMEOUT_S,
        interval_s: float = 0.05,
    ) -> None:
        """Poll ``GET path`` every ``interval_s`` seconds until it answers 200.

        Connection errors and other statuses count as not ready yet.

        Raises:
            ServerNotReady: the process exited first, or ``timeout_s`` seconds
                passed; the message carries the log.
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=self.base_url, timeout=5) as client:
            while True:
                if self.process.poll() is not None:
                    why = f"exited with {self.process.returncode}"
                    raise ServerNotReady(self._failure(why, path))
                try:
                    if client.get(path).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerNotReady(self._failure(f"silent {timeout_s} s", path))
                time.sleep(interval_s)

    def stop(
        self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S
    ) -> int:
        """Send ``sig``, then kill after ``timeout_s`` seconds; the exit status.

        Idempotent: a process that has exited already only reports its status
        (negative for a signal, as ``subprocess`` gives it).
        """
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _failure(self, why: str, path: str) -> str:
        return (
            f"{self.name} server {why} before {path} answered 200: "
            f"{' '.join(self.command)}\n{self.log_text()}"
        )
