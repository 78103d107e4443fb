"""Route access: API keys on the API, admin keys on operator routes, probes open,
JSON-only bodies, and the ``Host`` check of routes that need no key."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.access import REFUSAL_CODES, _host_name
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import Ledger

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio

API = {"authorization": "Bearer sk-api"}
ADMIN = {"authorization": "Bearer sk-admin"}
CHAT_BODY = {"messages": HELLO, "max_tokens": 4}


def _app(**config: object) -> Starlette:
    engine = ScriptedEngine(tokens_per_s=5000)
    return create_app(engine, ServerConfig(**config))  # type: ignore[arg-type]


def _client(app: Starlette, host: str = "127.0.0.1:8000") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


def _code(response: httpx.Response) -> str:
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    code: str = error["code"]
    return code


def _refused(metrics_text: str, code: str) -> float:
    line = f'sluicegate_refused_requests_total{{code="{code}"}} '
    for row in metrics_text.splitlines():
        if row.startswith(line):
            return float(row.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("path", ["/v1/models", "/openapi.json", "/v1/nothing"])
async def test_with_api_keys_every_api_route_needs_one(path: str) -> None:
    app = _app(api_keys=(ApiKey("sk-api"),))
    async with _client(app) as client:
        missing = await client.get(path)
        wrong = await client.get(path, headers={"authorization": "Bearer sk-no"})
        good = await client.get(path, headers=API)
    assert (missing.status_code, _code(missing)) == (401, "missing_api_key")
    assert (wrong.status_code, _code(wrong)) == (401, "invalid_api_key")
    assert good.status_code == (404 if path == "/v1/nothing" else 200)


async def test_probes_stay_open_whatever_the_keys() -> None:
    app = _app(api_keys=(ApiKey("sk-api"),), admin_keys=(ApiKey("sk-admin"),))
    async with _client(app, "probe.internal:8000") as client:
        health = await client.get("/health")
        ready = await client.get("/ready")
    assert (health.status_code, ready.status_code) == (200, 200)


@pytest.mark.parametrize("path", ["/metrics", "/engine/stats"])
async def test_operator_routes_take_admin_keys_only(path: str) -> None:
    app = _app(api_keys=(ApiKey("sk-api"),), admin_keys=(ApiKey("sk-admin"),))
    async with _client(app) as client:
        missing = await client.get(path)
        api_key = await client.get(path, headers=API)
        admin = await client.get(path, headers=ADMIN)
        admin_on_api = await client.get("/v1/models", headers=ADMIN)
    assert (missing.status_code, _code(missing)) == (401, "missing_admin_key")
    assert (api_key.status_code, _code(api_key)) == (401, "invalid_admin_key")
    assert admin.status_code == 200
    assert admin_on_api.status_code == 401  # an admin key is no API key


@pytest.mark.parametrize("path", ["/metrics", "/engine/stats"])
async def test_operator_routes_are_closed_when_only_api_keys_are_set(
    path: str,
) -> None:
    app = _app(api_keys=(ApiKey("sk-api"),))
    async with _client(app) as client:
        response = await client.get(path, headers=API)
    assert (response.status_code, _code(response)) == (403, "admin_key_required")


async def test_operator_routes_are_open_without_any_key() -> None:
    async with _client(_app()) as client:
        assert (await client.get("/metrics")).status_code == 200
        assert (await client.get("/engine/stats")).status_code == 200


async def test_refusals_write_no_ledger_row_and_are_counted() -> None:
    app = _app(api_keys=(ApiKey("sk-api"),), admin_keys=(ApiKey("sk-admin"),))
    engine: ScriptedEngine = app.state.engine
    async with _client(app) as client:
        for _ in range(5):
            response = await client.post(CHAT, json=CHAT_BODY)
            assert response.status_code == 401
        await client.post(CHAT, json=CHAT_BODY, headers={"authorization": "Bearer x"})
        await client.get("/metrics")
        served = await client.post(CHAT, json=CHAT_BODY, headers=API)
        text = (await client.get("/metrics", headers=ADMIN)).text
    assert served.status_code == 200
    ledger: Ledger = app.state.ledger
    assert [row.status for row in ledger.rows] == [200]
    assert engine.stats().finished_requests == 1
    assert _refused(text, "missing_api_key") == 5
    assert _refused(text, "invalid_api_key") == 1
    assert _refused(text, "missing_admin_key") == 1
    assert {"missing_api_key", "invalid_api_key", "missing_admin_key"} <= set(
        REFUSAL_CODES
    )


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"],
)
async def test_a_body_not_sent_as_json_is_415_before_the_engine(
    content_type: str | None,
) -> None:
    app = _app()
    engine: ScriptedEngine = app.state.engine
    headers = {} if content_type is None else {"content-type": content_type}
    body = b'{"messages": [{"role": "user", "content": "Hi"}]}'
    async with _client(app) as client:
        response = await client.post(CHAT, content=body, headers=headers)
    assert response.status_code == 415
    assert _code(response) == "unsupported_media_type"
    assert engine.stats().prompt_tokens == 0


async def test_json_with_a_charset_is_accepted() -> None:
    headers = {"content-type": "Application/JSON; charset=utf-8"}
    async with _client(_app()) as client:
        response = await client.post(
            CHAT,
            content=b'{"messages": [{"role": "user", "content": "Hi"}]}',
            headers=headers,
        )
    assert response.status_code == 200


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8000",
        "localhost:8000",
        "LOCALHOST.",
        "app.localhost:8000",
        "[::1]:8000",
        "10.1.2.3",
        "my-box:8000",
    ],
)
async def test_keyless_routes_answer_to_ip_literals_localhost_and_named_hosts(
    host: str,
) -> None:
    app = _app(allowed_hosts=("my-box",))
    async with _client(app, host) as client:
        assert (await client.get("/v1/models")).status_code == 200
        assert (await client.post(CHAT, json=CHAT_BODY)).status_code == 200
        assert (await client.get("/engine/stats")).status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8000", "127.0.0.1.evil.example", "my-box2"]
)
async def test_keyless_routes_refuse_other_host_names_with_421(host: str) -> None:
    app = _app(allowed_hosts=("my-box",))
    engine: ScriptedEngine = app.state.engine
    async with _client(app, host) as client:
        chat = await client.post(CHAT, json=CHAT_BODY)
        models = await client.get("/v1/models")
        stats = await client.get("/engine/stats")
        health = await client.get("/health")
    for response in (chat, models, stats):
        assert (response.status_code, _code(response)) == (421, "host_not_allowed")
    assert health.status_code == 200
    assert engine.stats().prompt_tokens == 0
    ledger: Ledger = app.state.ledger
    assert ledger.rows == []
    async with _client(app) as client:
        text = (await client.get("/metrics")).text
    assert _refused(text, "host_not_allowed") == 3


async def test_keyed_routes_and_a_star_skip_the_host_check() -> None:
    keyed = _app(api_keys=(ApiKey("sk-api"),), allowed_hosts=())
    anyone = _app(allowed_hosts=("*",))
    async with _client(keyed, "evil.example") as client:
        assert (await client.get("/v1/models", headers=API)).status_code == 200
    async with _client(anyone, "evil.example") as client:
        assert (await client.get("/v1/models")).status_code == 200


async def test_without_allowed_hosts_there_is_no_host_check() -> None:
    async with _client(_app(), "evil.example") as client:
        assert (await client.get("/v1/models")).status_code == 200


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("Example.COM:80", "example.com"),
        ("example.com.", "example.com"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("", ""),
    ],
)
def test_host_names_drop_the_port_case_and_trailing_dot(value: str, name: str) -> None:
    assert _host_name(value) == name
