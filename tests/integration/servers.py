"""Real sluicegate servers as subprocesses: start on a free port, wait, stop.

The process handling is ``sluicegate.testing.ServerProcess``; this module names
the servers after their test and turns a server that does not come up into a test
failure. Each server's stdout and stderr go to one log file, which a failing test
gets in its report (see ``conftest.py``).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sluicegate import testing
from sluicegate.testing import free_port

__all__ = ["N_CTX", "PARALLEL", "ServerProcess", "StartServer", "free_port"]

HEALTH_TIMEOUT_S = 120.0

N_CTX = 2048
"""KV cells of the llama.cpp test server: small, so that a prompt longer than the
context is cheap to build."""
PARALLEL = 2


class ServerProcess(testing.ServerProcess):
    """``python -m sluicegate serve`` on a free port, its output in a log file."""

    def __init__(self, name: str, extra_args: Sequence[str], log_dir: Path) -> None:
        port = free_port()
        super().__init__(
            testing.serve_command(port, *extra_args),
            port,
            log_path=log_dir / f"{name}-{port}.log",
            name=name,
        )

    def wait_healthy(self) -> None:
        """Wait until ``GET /health`` says ok; fail the test with the log if not."""
        try:
            self.wait_ready("/health", timeout_s=HEALTH_TIMEOUT_S)
        except testing.ServerNotReady as exc:
            pytest.fail(str(exc), pytrace=False)


StartServer = Callable[..., ServerProcess]
"""The ``start_server`` fixture: ``start_server(name, *serve_args)``."""


BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench(
    name: str, monkeypatch: pytest.MonkeyPatch, as_name: str | None = None
) -> Any:
    """The module ``bench/<name>.py`` (bench/ is scripts, not a package),
    registered for the test as ``as_name`` (default ``bench_<name>``): pydantic
    resolves its names there, and a script that imports another by its own
    name (``stream_native`` imports ``stream_load``) finds it."""
    spec = importlib.util.spec_from_file_location(
        as_name or f"bench_{name}", BENCH / f"{name}.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
