"""Fixtures of the Redis tests: the anyio backend (the Redis server is
``tests/redis_server.py``'s, shared by the whole run)."""

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """asyncio only: redis-py's asyncio client needs it."""
    return "asyncio"
