"""Several models side by side: each request goes to the engine of the model it
names; ``/v1/models`` lists them all; the first is the default."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.scripted.text import ScriptedTextEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.prepare.models import ServedModels
from tests.server.asgi import CHAT, COMPLETIONS, HELLO

pytestmark = pytest.mark.anyio


@pytest.fixture
def local() -> ScriptedEngine:
    return ScriptedEngine("local words", model_id="local", tokens_per_s=10_000)


@pytest.fixture
def remote() -> ScriptedTextEngine:
    return ScriptedTextEngine("remote words", model_id="remote", tokens_per_s=10_000)


async def _post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(path, json=body)


async def _get(app: Any, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path)


async def test_each_request_goes_to_the_engine_of_its_model(
    local: ScriptedEngine, remote: ScriptedTextEngine
) -> None:
    app = create_app([local, remote], ServerConfig(model_aliases=("default",)))
    answers = {}
    for model in ["local", "remote", "default", None]:
        body: dict[str, Any] = {"messages": HELLO}
        if model is not None:
            body["model"] = model
        response = await _post(app, CHAT, body)
        assert response.status_code == 200, response.text
        answers[model] = response.json()
    assert answers["local"]["choices"][0]["message"]["content"] == "local words"
    assert answers["remote"]["choices"][0]["message"]["content"] == "remote words"
    assert answers["remote"]["model"] == "remote"
    assert answers["default"]["model"] == answers[None]["model"] == "local"
    assert local.stats().finished_requests == 3
    assert remote.stats().finished_requests == 1


async def test_models_lists_every_model_and_an_unknown_one_is_a_404(
    local: ScriptedEngine, remote: ScriptedTextEngine
) -> None:
    app = create_app([local, remote], ServerConfig())
    listed = (await _get(app, "/v1/models")).json()
    assert [card["id"] for card in listed["data"]] == ["local", "remote"]
    assert (await _get(app, "/v1/models/remote")).json() == listed["data"][1]
    missing = await _get(app, "/v1/models/other")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    response = await _post(app, COMPLETIONS, {"model": "other", "prompt": "Hi"})
    assert response.status_code == 404
    assert "remote" in response.json()["error"]["message"]
    assert local.stats().finished_requests + remote.stats().finished_requests == 0


async def test_engine_stats_of_a_named_model(
    local: ScriptedEngine, remote: ScriptedTextEngine
) -> None:
    app = create_app([local, remote], ServerConfig())
    await _post(app, CHAT, {"model": "remote", "messages": HELLO})
    remote_stats = (await _get(app, "/engine/stats?model=remote")).json()
    default_stats = (await _get(app, "/engine/stats")).json()
    assert (remote_stats["finished_requests"], default_stats["finished_requests"]) == (
        1,
        0,
    )
    assert (await _get(app, "/engine/stats?model=nope")).status_code == 404


def test_model_ids_are_unique_and_aliases_do_not_shadow_them(
    local: ScriptedEngine,
) -> None:
    twin = ScriptedEngine(model_id="local")
    with pytest.raises(ValueError, match="two engines"):
        ServedModels([local, twin])
    with pytest.raises(ValueError, match="alias"):
        ServedModels([local], aliases=["local"])
    with pytest.raises(ValueError, match="at least one"):
        ServedModels([])
