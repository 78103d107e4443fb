"""A real ``sluicegate serve`` subprocess on a free port, for the live tests."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from sluicegate.testing import ServerNotReady, ServerProcess, free_port, serve_command


@contextmanager
def serve(args: Sequence[str], log_path: Path) -> Iterator[str]:
    """Start ``sluicegate serve *args``, wait for ``GET /health``; its base URL."""
    port = free_port()
    with ServerProcess(serve_command(port, *args), port, log_path=log_path) as server:
        try:
            server.wait_ready("/health")
        except ServerNotReady as exc:
            pytest.fail(str(exc), pytrace=False)
        yield server.base_url
