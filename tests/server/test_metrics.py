"""``/metrics``: Prometheus text with request, token, stream and engine metrics."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


async def test_metrics_count_requests_tokens_and_read_the_engine(
    app: Starlette,
) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post(CHAT, json={"messages": HELLO, "stream": True})
        await client.post(CHAT, json={"messages": HELLO, "n": 0})
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    finished = 'sluicegate_requests_total{end_state="finished",status="200"}'
    rejected = 'sluicegate_requests_total{end_state="rejected",status="400"}'
    assert _value(text, finished) == 1
    assert _value(text, rejected) == 1
    assert _value(text, 'sluicegate_tokens_total{kind="generated"}') > 0
    assert _value(text, "sluicegate_time_to_first_token_seconds_count") == 1
    assert _value(text, "sluicegate_inter_token_latency_seconds_count") == 1
    assert _value(text, "sluicegate_request_duration_seconds_count") == 2
    assert _value(text, "sluicegate_active_streams") == 0
    assert _value(text, "sluicegate_kv_cells_used") == 0
    assert _value(text, "sluicegate_kv_cells_total") > 0
    assert _value(text, "sluicegate_engine_queue_depth") == 0
    for name in ("heartbeats_sent", "coalesced_events", "engine_wasted_tokens"):
        assert _value(text, f"sluicegate_{name}_total") >= 0
