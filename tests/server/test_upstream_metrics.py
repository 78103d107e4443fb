"""/metrics of a server whose model comes from a pool of upstreams: per upstream,
labelled by model and URL. The upstream is a scripted sluicegate app, reached
in-process through httpx's ASGI transport."""

from __future__ import annotations

import time

import httpx
import pytest

from sluicegate.engines.base import ModelInfo
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.engine import UpstreamEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio

URL = "http://upstream.test/v1"


async def test_metrics_have_each_upstreams_streams_and_first_tokens() -> None:
    upstream = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig())
    transport = httpx.ASGITransport(app=upstream)
    engine = UpstreamEngine(
        ModelInfo("pooled", 0, int(time.time())),
        [UpstreamConfig(URL, model="scripted", max_streams=7, health_path="")],
        transport=transport,
        health_interval_s=0,
    )
    app = create_app(engine, ServerConfig())
    gateway = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=gateway, base_url="http://t") as client:
        for _ in range(2):
            response = await client.post(CHAT, json={"messages": HELLO})
            assert response.status_code == 200, response.text
        metrics = (await client.get("/metrics")).text
    await engine.aclose()
    labels = f'model="pooled",upstream="{URL}"'
    assert f"sluicegate_upstream_streams_total{{{labels}}} 2.0" in metrics
    assert f"sluicegate_upstream_in_flight{{{labels}}} 0.0" in metrics
    assert f"sluicegate_upstream_max_streams{{{labels}}} 7.0" in metrics
    assert f"sluicegate_upstream_failures_total{{{labels}}} 0.0" in metrics
    assert f"sluicegate_upstream_time_to_first_token_seconds_count{{{labels}}} 2.0" in (
        metrics
    )
