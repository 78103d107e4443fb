"""Waiting in async tests for a condition that a loop callback makes true."""

from __future__ import annotations

from collections.abc import Callable

import anyio


async def wait_until(condition: Callable[[], bool], timeout_s: float = 2.0) -> None:
    """Return once ``condition()`` holds, checking every millisecond.

    Raises:
        TimeoutError: it did not hold within ``timeout_s`` seconds.
    """
    with anyio.fail_after(timeout_s):
        while True:
            if condition():
                return
            await anyio.sleep(0.001)
