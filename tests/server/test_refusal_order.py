"""Which refusal a request meets first: its key, then a draining server.

A wrong or missing key is 401 even while the server drains: a retry cannot fix
it, on this replica or another, so it does not get the retryable 503 (which the
``openai`` SDK retries by itself). A request with a good key gets the 503 with
``Retry-After``; probes need no key and say the server is not ready.
"""

from __future__ import annotations

import httpx
import pytest

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio


async def test_a_draining_server_refuses_a_bad_key_401_and_a_good_key_503() -> None:
    engine = ScriptedEngine(tokens_per_s=5000)
    app = create_app(engine, ServerConfig(api_keys=(ApiKey("sk-good"),)))
    app.state.drain.draining = True
    transport = httpx.ASGITransport(app=app)
    body = {"messages": HELLO, "max_tokens": 1}
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:

        async def post(key: str | None) -> httpx.Response:
            headers = {"authorization": f"Bearer {key}"} if key else {}
            return await client.post(CHAT, json=body, headers=headers)

        missing, wrong, good = (
            await post(None),
            await post("sk-bad"),
            await post("sk-good"),
        )
        ready = await client.get("/ready")
    assert [r.status_code for r in (missing, wrong, good)] == [401, 401, 503]
    assert [r.json()["error"]["code"] for r in (missing, wrong, good)] == [
        "missing_api_key",
        "invalid_api_key",
        "server_shutting_down",
    ]
    assert "retry-after" not in missing.headers
    assert "retry-after" not in wrong.headers
    assert good.headers["retry-after"] == "1"
    assert ready.status_code == 503
    assert engine.stats().finished_requests == 0
