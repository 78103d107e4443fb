"""A server whose engine stopped for good shuts down and exits non-zero."""

from __future__ import annotations

import dataclasses

import pytest
import uvicorn

from sluicegate.engines.base import EngineStats
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.streaming.shutdown import DrainingServer

pytestmark = pytest.mark.anyio


class _FailingEngine(ScriptedEngine):
    """A scripted engine whose stats say its worker died."""

    failure: str | None = None

    def stats(self) -> EngineStats:
        return dataclasses.replace(super().stats(), failure=self.failure)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_server_exits_1_once_the_engine_reports_a_failure() -> None:
    engine = _FailingEngine()
    app = create_app(engine, ServerConfig())
    server = DrainingServer(uvicorn.Config(app), app.state.drain, 1.0, engine)
    assert await server.on_tick(0) is False
    assert server.exit_code == 0
    engine.failure = "RuntimeError('worker died')"
    assert await server.on_tick(1) is False  # the engine is read every 5th tick
    assert await server.on_tick(5) is True
    assert server.exit_code == 1
    await engine.aclose()


async def test_without_an_engine_to_watch_the_server_keeps_running() -> None:
    engine = _FailingEngine()
    engine.failure = "RuntimeError('worker died')"
    app = create_app(engine, ServerConfig())
    server = DrainingServer(uvicorn.Config(app), app.state.drain, 1.0)
    assert await server.on_tick(0) is False
    assert server.exit_code == 0
    await engine.aclose()
