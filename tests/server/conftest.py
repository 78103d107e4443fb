"""Fixtures of the server tests: the anyio backend, the stream writer, a scripted
engine and its app."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.streaming.sse_response import EventStreamResponse


@pytest.fixture
def anyio_backend() -> str:
    """The scripted engine runs on asyncio only."""
    return "asyncio"


@pytest.fixture(autouse=True)
def stream_writer(monkeypatch: pytest.MonkeyPatch) -> str:
    """How unpaced streams are written: ``eager`` (from the engine's callback
    too), or by the pump's task only with ``SLUICEGATE_TEST_WRITER=task`` in the
    environment (to run the server tests through the plain twin)."""
    name = os.environ.get("SLUICEGATE_TEST_WRITER", "eager")
    monkeypatch.setattr(EventStreamResponse, "eager", name == "eager")
    return name


@pytest.fixture
def engine() -> ScriptedEngine:
    """The default script (``DEFAULT_TEXT``), fast."""
    return ScriptedEngine(tokens_per_s=5000)


@pytest.fixture
def app(engine: ScriptedEngine) -> Starlette:
    """The app in front of ``engine``, default config."""
    return create_app(engine, ServerConfig())


@pytest.fixture
async def client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client on ``app`` (whole bodies only: not for streams)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client
