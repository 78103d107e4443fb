"""The small routes, the app's lifespan, config checks and ``max_tokens`` fitting."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import httpx
import pytest
from starlette.types import Message

from sluicegate.core.errors import EngineUnavailable, RequestError
from sluicegate.engines.base import GenerateRequest, SamplingParams
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.values import EngineStats
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.tokens import fit_max_tokens

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio


async def test_models_lists_the_served_model(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/models")
    assert response.status_code == 200
    assert response.json() == {
        "object": "list",
        "data": [
            {
                "id": "scripted",
                "object": "model",
                "created": 1_700_000_000,
                "owned_by": "sluicegate",
                "context_length": 4096,
            }
        ],
    }


async def test_health_is_ok(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert (response.status_code, response.json()) == (200, {"status": "ok"})


class _Restarting(ScriptedEngine):
    """An engine whose process is being restarted (``EngineStats.unavailable``)."""

    def stats(self) -> EngineStats:
        return dataclasses.replace(super().stats(), unavailable="restarting")


async def test_an_engine_being_restarted_is_not_ready_but_alive() -> None:
    app = create_app(_Restarting(), ServerConfig(retry_after_s=3))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        ready = await client.get("/ready")
        health = await client.get("/health")
    assert ready.status_code == 503
    assert ready.headers["retry-after"] == "3"
    assert ready.json()["error"]["code"] == "engine_unavailable"
    assert (health.status_code, health.json()) == (200, {"status": "engine_restarting"})


async def test_engine_stats_reflect_finished_requests(
    client: httpx.AsyncClient,
) -> None:
    await client.post(CHAT, json={"messages": HELLO, "max_tokens": 4})
    stats = (await client.get("/engine/stats")).json()
    assert stats["finished_requests"] == 1
    assert stats["generated_tokens"] == 4
    assert (stats["running"], stats["kv_cells_used"]) == (0, 0)
    assert stats["running_ids"] == []


async def test_shutdown_closes_the_engine() -> None:
    engine = ScriptedEngine()
    app = create_app(engine, ServerConfig())
    messages: list[Message] = [
        {"type": "lifespan.startup"},
        {"type": "lifespan.shutdown"},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    with anyio.fail_after(5):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert [m["type"] for m in sent] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    with pytest.raises(EngineUnavailable, match="closed"):
        engine.generate(GenerateRequest("late", (1,), SamplingParams(1)))


def test_fit_max_tokens_defaults_to_the_room_left() -> None:
    assert fit_max_tokens(10, None, 100, None) == 90
    assert fit_max_tokens(10, None, 100, 16) == 16
    assert fit_max_tokens(90, None, 100, 16) == 10
    assert fit_max_tokens(10, 90, 100, None) == 90


def test_fit_max_tokens_refuses_what_cannot_fit() -> None:
    with pytest.raises(RequestError, match="at most 90 fit") as info:
        fit_max_tokens(10, 91, 100, None)
    assert info.value.param == "max_tokens"
    with pytest.raises(RequestError, match="window is 100 tokens; the prompt has 100"):
        fit_max_tokens(100, None, 100, None, prompt_param="prompt")


@pytest.mark.parametrize(
    "bad",
    [
        {"heartbeat_interval_s": 0.0},
        {"max_body_bytes": 0},
        {"max_n": 0},
        {"default_max_tokens": 0},
    ],
)
def test_config_refuses_nonsense(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        ServerConfig(**bad)
