"""Helpers for ``serve --workers`` tests: reach one given worker of a port.

Each worker accepts on its own ``SO_REUSEPORT`` socket, and the kernel picks
the socket of a new connection by a hash of its addresses: a test that needs
a given worker opens connections until ``/health`` (which names the answering
worker's ``pid`` above one worker) says it reached it, and keeps that
connection (keep-alive) for its requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

__all__ = [
    "ATTEMPTS",
    "children_of",
    "client_on",
    "engine_pid",
    "eventually",
    "parent_of",
    "worker_pids",
]

ATTEMPTS = 400
"""Connections tried before a test fails: each reaches a given one of two
workers with probability about 1/2."""


def client_on(
    base_url: str, *, pid: int | None = None, not_pid: int | None = None
) -> tuple[httpx.Client, int]:
    """A client whose connection a worker holds (``pid``, or any but
    ``not_pid``), and that worker's pid; close it when done."""
    for _ in range(ATTEMPTS):
        client = httpx.Client(base_url=base_url, timeout=30)
        try:
            answered = int(client.get("/health").json()["pid"])
        except (httpx.TransportError, KeyError):
            client.close()
            continue
        if (pid is None or answered == pid) and answered != not_pid:
            return client, answered
        client.close()
    pytest.fail(f"no connection reached pid={pid} not_pid={not_pid}", pytrace=False)


def worker_pids(base_url: str, count: int = 2) -> set[int]:
    """The pids of ``count`` distinct workers answering on ``base_url``."""
    seen: set[int] = set()
    for _ in range(ATTEMPTS):
        with httpx.Client(base_url=base_url, timeout=30) as client:
            try:
                seen.add(int(client.get("/health").json()["pid"]))
            except httpx.TransportError:
                continue
        if len(seen) == count:
            return seen
    pytest.fail(f"only workers {sorted(seen)} answered", pytrace=False)


def parent_of(pid: int) -> int:
    """The parent process id of ``pid`` (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid in /proc/{pid}/status")


def eventually(check: Callable[[], bool], give_up_s: float = 30.0) -> bool:
    """Whether ``check()`` turns true within ``give_up_s`` seconds (a liveness
    deadline, polled every 20 ms, not a measure of speed)."""
    deadline = time.monotonic() + give_up_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def children_of(pid: int) -> dict[int, str]:
    """The child processes of ``pid``: pid -> command line (Linux ``/proc``)."""
    children: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        # the command may hold spaces and parentheses: the ppid follows the last ")"
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children[int(entry.name)] = command.decode(errors="replace")
    return children


def engine_pid(parent: int) -> int | None:
    """The engine process of the supervisor ``parent`` (``None``: none now)."""
    found = [p for p, c in children_of(parent).items() if "--engine-serve" in c]
    return found[0] if found else None
