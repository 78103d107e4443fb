"""Admission before the first byte: keys (401/403), quotas (429), draining (503)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import jinja2
import pytest
from starlette.applications import Starlette

from sluicegate.core.endstate import EndState
from sluicegate.core.errors import RequestError
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.keys import (
    ANONYMOUS,
    Admission,
    ApiKey,
    key_id_of,
    read_keys_file,
)
from sluicegate.server.admission.quotas import Quota, TokenBucket
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.answers import status_of
from sluicegate.server.http.errors import Forbidden, OverQuota, Unauthenticated
from sluicegate.server.ledger.ledger import Ledger

from .asgi import CHAT, HELLO, Exchange

pytestmark = pytest.mark.anyio

CHAT_BODY = {"messages": HELLO, "max_tokens": 8}


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def test_bucket_refills_continuously_up_to_its_capacity() -> None:
    bucket = TokenBucket(60, now=0.0)
    assert bucket.wait_s(60, 0.0) == 0
    bucket.take(60)
    assert bucket.wait_s(1, 0.0) == pytest.approx(1.0)
    assert bucket.wait_s(30, 10.0) == pytest.approx(20.0)
    assert bucket.level(1000.0) == 60
    bucket.give(100)
    assert bucket.level(1000.0) == 60


def test_keys_file_lines_give_keys_and_model_lists(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\n\nsk-a\nsk-b m1,m2\n")
    keys = read_keys_file(path)
    assert [(k.secret, k.models) for k in keys] == [
        ("sk-a", frozenset()),
        ("sk-b", frozenset({"m1", "m2"})),
    ]
    assert keys[0].key_id == key_id_of("sk-a") != "sk-a"
    assert "sk-a" not in repr(keys[0])
    path.write_text("sk-a m1 extra\n")
    with pytest.raises(ValueError, match=r"keys:1: expected"):
        read_keys_file(path)


@pytest.mark.parametrize("text", ["", "\n\n", "# keys\n  # more\n\n"])
def test_a_keys_file_without_a_key_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ValueError, match="holds no key"):  # never an open server
        read_keys_file(path)


def test_missing_and_unknown_keys_are_unauthenticated() -> None:
    admission = Admission([ApiKey("sk-good")])
    with pytest.raises(Unauthenticated) as missing:
        admission.authenticate({})
    assert missing.value.code == "missing_api_key"
    with pytest.raises(Unauthenticated) as unknown:
        admission.authenticate(_bearer("sk-bad"))
    assert unknown.value.code == "invalid_api_key"
    assert admission.authenticate(_bearer("sk-good")) == ApiKey("sk-good")
    assert Admission().authenticate({}) is None


def test_a_key_limited_to_other_models_is_forbidden() -> None:
    key = ApiKey("sk", frozenset({"other"}))
    with pytest.raises(Forbidden):
        Admission([key]).admit(key, "served", 10)


def test_tokens_quota_reserves_and_returns_the_unused_part() -> None:
    clock = FakeClock()
    admission = Admission(quota=Quota(tokens_per_minute=100), clock=clock)
    grant = admission.admit(None, "m", 80)
    assert grant.key_id == ANONYMOUS
    with pytest.raises(OverQuota) as over:
        admission.admit(None, "m", 40)
    assert over.value.retry_after_s == 12  # 20 missing at 100/60 per second
    grant.release(30)  # 50 unused tokens come back
    grant.release(0)  # only once
    admission.admit(None, "m", 40)


def test_over_quota_says_whether_only_the_tokens_bucket_is_short() -> None:
    clock = FakeClock()
    quota = Quota(requests_per_minute=2, tokens_per_minute=100)
    admission = Admission(quota=quota, clock=clock)
    admission.admit(None, "m", 90)
    admission.admit(None, "m", 5)
    with pytest.raises(OverQuota) as requests:
        admission.admit(None, "m", 1)
    assert not requests.value.tokens_only
    with pytest.raises(OverQuota) as both:
        admission.admit(None, "m", 50)
    assert not both.value.tokens_only
    clock.now += 30  # a request back; 5 + 50 tokens
    with pytest.raises(OverQuota) as tokens:
        admission.admit(None, "m", 100)
    assert tokens.value.tokens_only
    assert tokens.value.retry_after_s == 27  # 45 missing at 100/60 per second


def test_requests_quota_refills_with_time() -> None:
    clock = FakeClock()
    admission = Admission(quota=Quota(requests_per_minute=2), clock=clock)
    admission.admit(None, "m", 1)
    admission.admit(None, "m", 1)
    with pytest.raises(OverQuota) as over:
        admission.admit(None, "m", 1)
    assert over.value.retry_after_s == 30
    clock.now += 30
    admission.admit(None, "m", 1)


def test_a_request_larger_than_the_tokens_quota_is_refused_outright() -> None:
    admission = Admission(quota=Quota(tokens_per_minute=10))
    with pytest.raises(RequestError) as never:
        admission.admit(None, "m", 11)
    assert (status_of(never.value), never.value.param) == (400, "max_tokens")
    assert never.value.code == "tokens_over_quota"
    admission.admit(None, "m", 10)  # nothing was taken by the refusal


def test_more_choices_than_the_engine_can_queue_are_refused_outright() -> None:
    admission = Admission(quota=Quota(requests_per_minute=1), submit_limit=2)
    with pytest.raises(RequestError) as never:
        admission.admit(None, "m", 1, sequences=3)
    assert (status_of(never.value), never.value.param) == (400, "n")
    assert never.value.code == "n_over_capacity"
    admission.admit(None, "m", 1, sequences=2)  # the request unit was not spent


def test_a_refund_gives_back_the_request_and_its_tokens_once() -> None:
    clock = FakeClock()
    quota = Quota(requests_per_minute=1, tokens_per_minute=100)
    admission = Admission(quota=quota, clock=clock)
    grant = admission.admit(None, "m", 100)
    grant.refund()
    grant.refund()
    grant.release(0)  # settled already: nothing more comes back
    again = admission.admit(None, "m", 100)
    with pytest.raises(OverQuota):
        admission.admit(None, "m", 1)
    again.release(100)


def _keyed_app(engine: ScriptedEngine, **config: object) -> Starlette:
    keys = (ApiKey("sk-all"), ApiKey("sk-other", frozenset({"other-model"})))
    return create_app(engine, ServerConfig(api_keys=keys, **config))  # type: ignore[arg-type]


async def _post(app: Starlette, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(CHAT, json=CHAT_BODY, headers=headers)


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "missing_api_key"),
        (_bearer("sk-wrong"), 401, "invalid_api_key"),
        ({"authorization": "Basic sk-all"}, 401, "missing_api_key"),
        (_bearer("sk-other"), 403, "model_access_denied"),
    ],
)
async def test_bad_keys_are_refused_in_openai_shape_before_the_engine(
    headers: dict[str, str], status: int, code: str
) -> None:
    engine = ScriptedEngine(tokens_per_s=5000)
    app = _keyed_app(engine)
    response = await _post(app, headers)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert "sk-" not in error["message"]
    assert engine.stats().prompt_tokens == 0
    ledger: Ledger = app.state.ledger
    if status == 401:  # refused before routing: counted, no row (test_access.py)
        assert ledger.rows == []
        return
    row = ledger.rows[-1]
    assert (row.end_state, row.status) == (EndState.REJECTED, status)
    assert "sk-" not in row.key_id


async def test_a_good_key_is_served_and_its_id_recorded() -> None:
    app = _keyed_app(ScriptedEngine(tokens_per_s=5000))
    response = await _post(app, _bearer("sk-all"))
    assert response.status_code == 200
    ledger: Ledger = app.state.ledger
    assert ledger.rows[-1].key_id == key_id_of("sk-all")


async def test_over_quota_is_429_with_retry_after_and_never_reaches_the_engine() -> (
    None
):
    engine = ScriptedEngine(tokens_per_s=5000)
    app = _keyed_app(engine, quota=Quota(requests_per_minute=1))
    assert (await _post(app, _bearer("sk-all"))).status_code == 200
    generated = engine.stats().generated_tokens
    response = await _post(app, _bearer("sk-all"))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "60"
    assert response.json()["error"]["type"] == "rate_limit_error"
    assert engine.stats().generated_tokens == generated
    assert engine.stats().finished_requests == 1


async def test_a_small_request_short_of_tokens_gets_the_wait_for_its_real_reserve(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The least a chat request reserves counts one prompt token; its plan counts
    the rendered prompt. A small body is planned before its 429, so a retry after
    its Retry-After passes; a body over the bound is refused on the least, before
    the template runs."""
    clock = FakeClock()
    engine = ScriptedEngine(
        tokens_per_s=5000, script="one two three " * 40, context_length=100_000
    )
    app = create_app(engine, ServerConfig(quota=Quota(tokens_per_minute=60)))
    routes = app.routes[0].endpoint.__self__  # type: ignore[attr-defined]
    routes.admission._clock = clock  # 1 token a second, on this clock
    one = {"messages": HELLO, "max_tokens": 1}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        first = await client.post(CHAT, json=one)
        reserve = first.json()["usage"]["prompt_tokens"] + 1
        assert reserve > 2  # else the least would already be exact
        clock.now += 60  # full again
        body = {"messages": HELLO, "max_tokens": 61 - reserve}  # takes all 60
        assert (await client.post(CHAT, json=body)).status_code == 200

        renders: list[int] = []
        render = jinja2.Template.render

        def counted(self: jinja2.Template, *args: Any, **kwargs: Any) -> str:
            renders.append(1)
            return render(self, *args, **kwargs)

        monkeypatch.setattr(jinja2.Template, "render", counted)
        padded = [{"role": "user", "content": "x" * 70_000}]
        big = await client.post(CHAT, json={"messages": padded, "max_tokens": 1})
        assert big.status_code == 429, big.text
        assert big.headers["retry-after"] == "2"  # the least: 1 + 1 tokens
        assert renders == []  # refused before the template

        small = await client.post(CHAT, json=one)
        assert small.status_code == 429
        assert small.headers["retry-after"] == str(reserve)  # its prompt counted
        assert renders == [1]
        clock.now += reserve
        assert (await client.post(CHAT, json=one)).status_code == 200
    assert renders == [1, 1]


async def test_a_draining_server_answers_503_and_is_not_ready(app: Starlette) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        assert (await client.get("/ready")).status_code == 200
        app.state.drain.draining = True
        ready = await client.get("/ready")
        response = await client.post(CHAT, json=CHAT_BODY)
        health = await client.get("/health")
    assert (ready.status_code, ready.headers["retry-after"]) == (503, "1")
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert json.loads(response.text)["error"]["code"] == "server_shutting_down"
    assert (health.status_code, health.json()) == (200, {"status": "draining"})


async def _chat(app: Starlette, body: dict[str, object]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.post(CHAT, json=body)


async def test_n_above_what_the_engine_queues_is_a_400_naming_n_even_when_idle() -> (
    None
):
    engine = ScriptedEngine(tokens_per_s=5000, max_running=1, max_queued=1)
    app = create_app(engine, ServerConfig(quota=Quota(requests_per_minute=1)))
    response = await _chat(app, {**CHAT_BODY, "n": 3})
    assert response.status_code == 400
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("n", "n_over_capacity")
    assert engine.stats().prompt_tokens == 0
    # The refusal spent no request: the one allowed this minute still runs.
    assert (await _chat(app, {**CHAT_BODY, "n": 2})).status_code == 200


async def test_a_reservation_over_the_whole_tokens_quota_is_a_400_not_a_429() -> None:
    app = create_app(ScriptedEngine(), ServerConfig(quota=Quota(tokens_per_minute=50)))
    response = await _chat(app, {**CHAT_BODY, "max_tokens": 40, "n": 2})
    assert response.status_code == 400  # the openai SDK retries 429 for ever
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "max_tokens")
    assert error["code"] == "tokens_over_quota"
    ledger: Ledger = app.state.ledger
    assert (ledger.rows[-1].end_state, ledger.rows[-1].status) == (
        EndState.REJECTED,
        400,
    )


async def test_a_full_queue_503_spends_no_request_quota() -> None:
    engine = ScriptedEngine(tokens_per_s=50, max_running=1, max_queued=0)
    app = create_app(engine, ServerConfig(quota=Quota(requests_per_minute=2)))
    long = {"messages": HELLO, "stream": True, "max_tokens": 1000}
    running = Exchange(app, CHAT, long)
    async with anyio.create_task_group() as tg:
        tg.start_soon(running.run)
        await running.wait_for(running.has_content)
        for _ in range(3):  # each finds the queue full; none spends the 2nd unit
            full = await _chat(app, CHAT_BODY)
            assert (full.status_code, full.headers["retry-after"]) == (503, "1")
        running.leave()
    assert (await _chat(app, CHAT_BODY)).status_code == 200
    assert (await _chat(app, CHAT_BODY)).status_code == 429
