"""The playground's routes, its recent-requests endpoint and CORS, in process.

The page itself runs in a real browser in tests/browser/; here are its files, who
may fetch them, and the headers around them.
"""

from __future__ import annotations

import argparse
import re
from importlib import resources

import httpx
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.app.options import add_serve_options, config_fields
from sluicegate.server.app.playground import MAX_RECENT, row_payload
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.cors import Cors, normalize_origin
from sluicegate.server.ledger.ledger import LedgerRow

pytestmark = pytest.mark.anyio

ORIGIN = "http://tool.example:9000"
ADMIN = {"authorization": "Bearer sk-admin"}
FILES = resources.files("sluicegate.server.app").joinpath("playground_files")
COMPLETION = {"prompt": "Hi", "max_tokens": 2}


def _app(**config: object) -> Starlette:
    engine = ScriptedEngine(tokens_per_s=5000)
    return create_app(engine, ServerConfig(**config))  # type: ignore[arg-type]


def _client(app: Starlette, host: str = "127.0.0.1:8000") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}")


async def test_root_redirects_to_the_page_and_its_files_are_served() -> None:
    async with _client(_app()) as client:
        root = await client.get("/")
        page = await client.get("/playground")
        script = await client.get("/playground/playground.js")
        style = await client.get("/playground/playground.css")
        missing = await client.get("/playground/nothing.js")
    assert (root.status_code, root.headers["location"]) == (307, "/playground")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    assert style.headers["content-type"] == "text/css; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp
    assert "script-src 'self'" in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert missing.status_code == 404
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}


async def test_the_page_loads_only_its_own_files() -> None:
    """Every file the page names is one of its own, served here; none names a
    URL elsewhere (a CDN), a web font or a CSS import."""
    names = sorted(f.name for f in FILES.iterdir() if f.is_file())
    html = FILES.joinpath("index.html").read_text(encoding="utf-8")
    linked = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert sorted(linked) == ["/playground/playground.css", "/playground/playground.js"]
    imported: list[str] = []
    for name in names:
        text = FILES.joinpath(name).read_text(encoding="utf-8")
        imported += re.findall(r'^import .* from "\./([^"]+)";$', text, re.MULTILINE)
        code = "\n".join(
            line for line in text.splitlines() if not line.lstrip().startswith("//")
        )
        assert not re.search(r"https?://|@import|url\(|@font-face", code), name
    assert sorted(set(imported)) == ["server.js", "sse.js", "stream.js"]
    async with _client(_app()) as client:
        for name in names:
            response = await client.get(f"/playground/{name}")
            assert response.status_code == 200, name


async def test_the_page_needs_no_key_but_checks_the_host() -> None:
    app = _app(
        api_keys=(ApiKey("sk-api"),),
        allowed_hosts=("127.0.0.1",),
    )
    async with _client(app) as client:
        page = await client.get("/playground")
        models = await client.get("/v1/models")
    async with _client(app, "rebound.example") as client:
        elsewhere = await client.get("/playground")
    assert page.status_code == 200
    assert models.status_code == 401
    assert elsewhere.status_code == 421


async def test_recent_requests_are_an_operator_route() -> None:
    keyed = _app(api_keys=(ApiKey("sk-api"),))
    admin = _app(api_keys=(ApiKey("sk-api"),), admin_keys=(ApiKey("sk-admin"),))
    api = {"authorization": "Bearer sk-api"}
    async with _client(keyed) as client:
        closed = await client.get("/engine/requests", headers=api)
    async with _client(admin) as client:
        missing = await client.get("/engine/requests", headers=api)
        good = await client.get("/engine/requests", headers=ADMIN)
    assert closed.json()["error"]["code"] == "admin_key_required"
    assert missing.status_code == 401
    assert good.status_code == 200


async def test_recent_requests_list_the_newest_rows_first() -> None:
    async with _client(_app()) as client:
        ids = []
        for _ in range(3):
            response = await client.post("/v1/completions", json=COMPLETION)
            ids.append(response.json()["id"])
        everything = (await client.get("/engine/requests")).json()
        two = (await client.get("/engine/requests?limit=2")).json()
        one = (await client.get(f"/engine/requests?id={ids[0]}")).json()
        none = (await client.get("/engine/requests?id=cmpl-none")).json()
    assert everything["object"] == "list"
    assert [r["request_id"] for r in everything["data"]] == ids[::-1]
    assert [r["request_id"] for r in two["data"]] == ids[:0:-1]
    (row,) = one["data"]
    assert row["request_id"] == ids[0]
    assert row["end_state"] == "finished"
    assert row["finish_reasons"] == ["length"]
    assert row["completion_tokens"] == 2
    assert none["data"] == []


@pytest.mark.parametrize(
    "limit", ["0", str(MAX_RECENT + 1), "x", "-1", "\u00b2", "9" * 5000]
)
async def test_recent_requests_refuse_a_limit_out_of_range(limit: str) -> None:
    async with _client(_app()) as client:
        response = await client.get("/engine/requests", params={"limit": limit})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "limit"


def test_a_row_payload_has_wire_strings() -> None:
    row = LedgerRow(
        request_id="cmpl-1",
        endpoint="/v1/completions",
        model=None,
        status=200,
        end_state=EndState.ABORTED,
        prompt_tokens=1,
        completion_tokens=0,
        finish_reasons=(None, FinishReason.STOP),
        received_at=1.0,
        first_token_at=None,
        ended_at=2.0,
    )
    payload = row_payload(row)
    assert payload["end_state"] == "aborted"
    assert payload["finish_reasons"] == [None, "stop"]


async def test_cors_is_off_by_default() -> None:
    preflight_headers = {"origin": ORIGIN, "access-control-request-method": "POST"}
    async with _client(_app()) as client:
        preflight = await client.options("/v1/completions", headers=preflight_headers)
        models = await client.get("/v1/models", headers={"origin": ORIGIN})
    assert preflight.status_code == 405
    assert "access-control-allow-origin" not in preflight.headers
    assert "access-control-allow-origin" not in models.headers


async def test_an_allowed_origin_gets_its_preflight_and_headers() -> None:
    app = _app(cors_origins=(ORIGIN.upper(),), api_keys=(ApiKey("sk-api"),))
    asked = {
        "origin": ORIGIN,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type",
        "access-control-request-private-network": "true",
    }
    api = {"origin": ORIGIN, "authorization": "Bearer sk-api"}
    async with _client(app) as client:
        preflight = await client.options("/v1/chat/completions", headers=asked)
        stream = await client.post(
            "/v1/completions", json={**COMPLETION, "stream": True}, headers=api
        )
        refused = await client.get("/v1/models", headers={"origin": ORIGIN})
        other = await client.get(
            "/v1/models", headers={"origin": "http://other.example"}
        )
        other_preflight = await client.options(
            "/v1/models", headers={**asked, "origin": "http://other.example"}
        )
        plain_options = await client.options("/v1/models", headers={"origin": ORIGIN})
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == ORIGIN
    methods = preflight.headers["access-control-allow-methods"].split(", ")
    assert methods == ["GET", "POST", "DELETE"]  # DELETE /v1/responses/{id}
    allowed = preflight.headers["access-control-allow-headers"].split(", ")
    for header in ("authorization", "x-api-key", "anthropic-version"):
        assert header in allowed  # both SDKs' keys, from a browser
    assert {"idempotency-key", "last-event-id"} <= set(allowed)
    assert preflight.headers["access-control-allow-private-network"] == "true"
    assert stream.status_code == 200
    assert stream.headers["access-control-allow-origin"] == ORIGIN
    assert stream.headers["content-type"].startswith("text/event-stream")
    assert stream.text.endswith("data: [DONE]\n\n")
    assert refused.status_code == 401  # a refusal the page can read
    assert refused.headers["access-control-allow-origin"] == ORIGIN
    assert refused.headers["vary"] == "Origin"
    assert "access-control-allow-origin" not in other.headers
    assert other_preflight.status_code == 401  # not answered: the guard's
    assert plain_options.status_code == 401  # no request method: no preflight


async def test_a_star_allows_any_origin() -> None:
    async with _client(_app(cors_origins=("*",))) as client:
        models = await client.get("/v1/models", headers={"origin": ORIGIN})
        long = await client.get(
            "/v1/models", headers={"origin": "http://" + "a" * 3000}
        )
        without = await client.get("/v1/models")
        preflight = await client.options(
            "/v1/models",
            headers={"origin": ORIGIN, "access-control-request-method": "GET"},
        )
    assert models.headers["access-control-allow-origin"] == "*"
    assert preflight.status_code == 204
    assert "access-control-allow-private-network" not in preflight.headers
    assert "access-control-allow-origin" not in long.headers
    assert "access-control-allow-origin" not in without.headers


@pytest.mark.parametrize(
    ("origin", "normal"),
    [
        ("http://Example.COM:8080", "http://example.com:8080"),
        ("https://example.com/", "https://example.com"),
        (" * ", "*"),
    ],
)
def test_origins_are_normalized(origin: str, normal: str) -> None:
    assert normalize_origin(origin) == normal


@pytest.mark.parametrize(
    "origin",
    ["example.com", "ftp://example.com", "http://example.com/app", "http://u@h", ""],
)
def test_a_malformed_origin_is_refused(origin: str) -> None:
    with pytest.raises(ValueError, match="CORS origin"):
        Cors([origin])
    with pytest.raises(ValueError, match="CORS origin"):
        _app(cors_origins=(origin,))


def test_serve_takes_cors_origins() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    add_serve_options(parser)
    args = ["--cors-origin", ORIGIN, "--cors-origin", "http://localhost:3000"]
    fields = config_fields(parser.parse_args(args))
    assert fields["cors_origins"] == (ORIGIN, "http://localhost:3000")
    assert config_fields(parser.parse_args([]))["cors_origins"] == ()
