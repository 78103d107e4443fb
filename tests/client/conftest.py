import pytest

from .drivers import KINDS


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=KINDS)
def client_kind(request: pytest.FixtureRequest) -> str:
    """``"sync"`` or ``"async"``: every client test runs on both clients."""
    kind: str = request.param
    return kind
