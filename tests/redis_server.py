"""A real Redis for the tests: Debian's ``redis-server`` on loopback, in a temp dir.

``scripts/install-system-deps`` installs ``redis-server``. The session fixture
``redis_server`` starts one for the whole run (a free port, bound to
``127.0.0.1``, no persistence, its working dir a fresh temp dir), waits until it
answers ``PING``, and stops it at the end. ``redis_url`` gives each test that URL
with the database flushed first, so tests do not see each other's keys. A test
without ``redis-server`` installed is skipped, naming the script that installs it.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluicegate.testing import free_port

__all__ = ["RedisServer", "redis_server", "redis_url"]

START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0
BINARY = "/usr/bin/redis-server"


class RedisServer:
    """One ``redis-server`` process serving ``root`` (a temp dir) on loopback."""

    def __init__(self, root: Path, *options: str) -> None:
        self.root = root
        self.options = options
        """More ``redis-server`` options (``--maxmemory 1mb``), after ours."""
        self.port = free_port()
        self.log_path = root / "redis.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers ``PING``.

        Raises:
            pytest.fail: it exited or did not answer within ``START_TIMEOUT_S``.
        """
        command = [
            BINARY,
            *("--port", str(self.port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(self.root)),
            *("--logfile", str(self.log_path)),
            *self.options,
        ]
        self.process = subprocess.Popen(command)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.command(b"PING").startswith(b"+PONG"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.log_path.read_text() if self.log_path.exists() else ""
                pytest.fail(f"redis-server did not start:\n{log}")
            time.sleep(0.02)

    def command(self, *words: bytes) -> bytes:
        """Send one command (RESP array) and return the raw first reply; ``b""``
        when the server does not answer."""
        request = b"*%d\r\n" % len(words)
        for word in words:
            request += b"$%d\r\n%s\r\n" % (len(word), word)
        try:
            with socket.create_connection(("127.0.0.1", self.port), 1.0) as sock:
                sock.sendall(request)
                return sock.recv(65536)
        except OSError:
            return b""

    def kill(self) -> None:
        """Kill the server at once (SIGKILL: no shutdown, nothing saved); ``start``
        runs it again on the same port, empty."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Stop the server (SIGTERM; SIGKILL if it lingers)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One Redis for the whole run, stopped at its end."""
    if shutil.which(BINARY) is None:
        pytest.skip("redis-server is not installed (scripts/install-system-deps)")
    with tempfile.TemporaryDirectory(prefix="sluicegate-redis-") as root:
        server = RedisServer(Path(root))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session Redis's URL, its database flushed for this test."""
    if not redis_server.command(b"FLUSHALL").startswith(b"+OK"):
        pytest.fail("redis-server did not answer FLUSHALL")
    return redis_server.url
