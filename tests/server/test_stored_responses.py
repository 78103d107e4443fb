"""Stored Responses in the app (scripted engine): background, retrieve, resume
from a sequence number, cancel, delete, ``previous_response_id``, and who may
read what."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.core.wire.sse import SSEDecoder
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import DEFAULT_TEXT, ScriptedEngine
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.errors import CLIENT_CLOSED, StoreError
from sluicegate.server.stores.memory_store import MemoryEventStore

from ..polling import wait_until
from .asgi import Exchange, on_clock

pytestmark = pytest.mark.anyio

RESPONSES = "/v1/responses"
ALICE = {"authorization": "Bearer sk-alice"}
BOB = {"authorization": "Bearer sk-bob"}


def _client(engine: ScriptedEngine, **config: Any) -> httpx.AsyncClient:
    keys = (ApiKey("sk-alice", key_id="alice"), ApiKey("sk-bob", key_id="bob"))
    app = create_app(engine, ServerConfig(api_keys=keys, **config))
    transport = httpx.ASGITransport(app=app)
    client = httpx.AsyncClient(transport=transport, base_url="http://t", headers=ALICE)
    client.app = app  # type: ignore[attr-defined]
    return client


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with _client(ScriptedEngine(tokens_per_s=2000)) as client:
        yield client


def events(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """Each event's ``id:`` and JSON (comments dropped)."""
    decoder = SSEDecoder()
    return [(e.id, json.loads(e.data)) for e in decoder.feed(body) + decoder.flush()]


async def ended(client: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    """Poll ``GET /v1/responses/{id}`` until the response ended; its object."""
    with anyio.fail_after(10):
        while True:
            got = await client.get(f"{RESPONSES}/{response_id}")
            assert got.status_code == 200, got.text
            body: dict[str, Any] = got.json()
            if body["status"] not in ("queued", "in_progress"):
                return body
            await anyio.sleep(0.01)


def text_of(response: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


async def test_a_background_response_answers_at_once_and_runs_to_its_end(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post(
        RESPONSES, json={"model": "scripted", "input": "Hi", "background": True}
    )
    assert created.status_code == 200
    first = created.json()
    assert (first["status"], first["background"], first["output"]) == (
        "in_progress",
        True,
        [],
    )
    final = await ended(client, first["id"])
    assert final["status"] == "completed"
    assert final["background"] is True
    assert text_of(final) == DEFAULT_TEXT
    plain = (
        await client.post(RESPONSES, json={"model": "scripted", "input": "Hi"})
    ).json()
    assert text_of(plain) == text_of(final)
    assert final["usage"] == plain["usage"]
    assert final["output"][0]["status"] == plain["output"][0]["status"]


async def test_a_stream_resumes_after_any_sequence_number_then_ends_once(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "scripted", "input": "Hi", "background": True, "stream": True}
    whole = await client.post(RESPONSES, json=body)
    assert whole.status_code == 200
    full = events(whole.content)
    response_id = full[0][1]["response"]["id"]
    assert [i for i, _ in full] == [f"{response_id}.{n}" for n in range(len(full))]
    assert [p["sequence_number"] for _, p in full] == list(range(len(full)))
    for after in (0, 3, len(full) - 2):
        path = f"{RESPONSES}/{response_id}?stream=true&starting_after={after}"
        resumed = await client.get(path)
        assert resumed.status_code == 200
        assert resumed.headers["content-type"].startswith("text/event-stream")
        assert events(resumed.content) == full[after + 1 :]
    for after in (len(full) - 1, len(full) + 5):  # read to its end: not a 200
        path = f"{RESPONSES}/{response_id}?stream=true&starting_after={after}"
        past = await client.get(path)
        assert past.status_code == 400
        assert past.json()["error"]["code"] == "cursor_past_end"
        assert past.json()["error"]["param"] == "starting_after"
    by_header = await client.get(
        f"{RESPONSES}/{response_id}?stream=true",
        headers={"last-event-id": f"{response_id}.4"},
    )
    assert events(by_header.content) == full[5:]
    everything = await client.get(f"{RESPONSES}/{response_id}?stream=true")
    assert events(everything.content) == full
    ends = {"response.completed", "response.incomplete", "response.failed"}
    assert [p["type"] for _, p in full if p["type"] in ends] == ["response.completed"]


async def test_retrieve_refuses_what_it_cannot_find_or_read(
    client: httpx.AsyncClient,
) -> None:
    stored = (
        await client.post(
            RESPONSES, json={"model": "scripted", "input": "Hi", "store": True}
        )
    ).json()
    assert stored["status"] == "completed"
    path = f"{RESPONSES}/{stored['id']}"
    assert (await client.get(path)).json() == stored
    unstored = (
        await client.post(RESPONSES, json={"model": "scripted", "input": "Hi"})
    ).json()
    not_found = [
        await client.get(path, headers=BOB),  # another key's
        await client.get(f"{RESPONSES}/{unstored['id']}"),  # never stored
        await client.get(f"{RESPONSES}/resp_0123"),
        await client.get(path + "?stream=true", headers=BOB),
        await client.delete(path, headers=BOB),
        await client.post(path + "/cancel", headers=BOB),
    ]
    for answer in not_found:
        assert answer.status_code == 404, answer.text
        assert answer.json()["error"]["code"] == "not_found"
    for bad in ("-1", "x", "1.5"):
        answer = await client.get(f"{path}?stream=true&starting_after={bad}")
        assert answer.status_code == 400
        assert answer.json()["error"]["param"] == "starting_after"


async def test_the_server_default_stores_what_does_not_say() -> None:
    async with _client(ScriptedEngine(), store_responses=True) as client:
        kept = (
            await client.post(RESPONSES, json={"model": "scripted", "input": "Hi"})
        ).json()
        assert (await client.get(f"{RESPONSES}/{kept['id']}")).status_code == 200
        body = {"model": "scripted", "input": "Hi", "store": False}
        unkept = (await client.post(RESPONSES, json=body)).json()
        assert (await client.get(f"{RESPONSES}/{unkept['id']}")).status_code == 404
        refused = await client.post(RESPONSES, json={**body, "background": True})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "store"


async def test_cancel_aborts_a_background_response_in_the_engine() -> None:
    engine = ScriptedEngine(tokens_per_s=200, never_finishes=True)
    async with _client(engine) as client:
        body = {"model": "scripted", "input": "Hi", "background": True}
        first = (await client.post(RESPONSES, json=body)).json()
        await wait_until(lambda: engine.stats().generated_tokens >= 3, 5)
        cancelled = await client.post(f"{RESPONSES}/{first['id']}/cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "cancelled"
        assert cancelled.json()["output"]  # the text so far
        stats = engine.stats()
        assert (stats.running, stats.kv_cells_used) == (0, 0)
        assert stats.aborted_requests == 1
        assert (await client.get(f"{RESPONSES}/{first['id']}")).json() == (
            cancelled.json()
        )
        again = await client.post(f"{RESPONSES}/{first['id']}/cancel")
        assert again.json() == cancelled.json()  # an ended one: as it ended
        log = await client.get(f"{RESPONSES}/{first['id']}?stream=true")
        last = events(log.content)[-1][1]
        assert (last["type"], last["response"]["status"]) == (
            "response.failed",
            "cancelled",
        )
        rows = client.app.state.ledger.rows  # type: ignore[attr-defined]
        assert [r.end_state for r in rows] == [EndState.ABORTED]


async def test_cancel_of_a_response_that_ended_on_its_own_is_a_400(
    client: httpx.AsyncClient,
) -> None:
    """It answered 200 with the completed object; OpenAI's API refuses it, and
    a cancelled one answers as it ended (above); it can still be deleted."""
    body = {"model": "scripted", "input": "Hi", "background": True}
    background = await ended(
        client, (await client.post(RESPONSES, json=body)).json()["id"]
    )
    plain = {"model": "scripted", "input": "Hi", "store": True}
    synchronous = (await client.post(RESPONSES, json=plain)).json()
    for response, message in (
        (background, "Cannot cancel a completed response."),
        (synchronous, "Cannot cancel a synchronous response."),
    ):
        assert response["status"] == "completed"
        refused = await client.post(f"{RESPONSES}/{response['id']}/cancel")
        assert refused.status_code == 400
        assert refused.json() == {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        assert (await client.get(f"{RESPONSES}/{response['id']}")).json() == response
    assert (await client.delete(f"{RESPONSES}/{background['id']}")).status_code == 200


async def test_delete_forgets_a_response_and_cancels_a_running_one() -> None:
    engine = ScriptedEngine(tokens_per_s=200, never_finishes=True)
    async with _client(engine) as client:
        body = {"model": "scripted", "input": "Hi", "background": True}
        running = (await client.post(RESPONSES, json=body)).json()
        deleted = await client.delete(f"{RESPONSES}/{running['id']}")
        assert deleted.status_code == 200
        assert deleted.json() == {
            "id": running["id"],
            "object": "response",
            "deleted": True,
        }
        assert engine.stats().running == 0
        for answer in (
            await client.get(f"{RESPONSES}/{running['id']}"),
            await client.get(f"{RESPONSES}/{running['id']}?stream=true"),
            await client.delete(f"{RESPONSES}/{running['id']}"),
        ):
            assert answer.status_code == 404


async def test_previous_response_id_continues_its_input_and_output(
    client: httpx.AsyncClient,
) -> None:
    first = (
        await client.post(
            RESPONSES, json={"model": "scripted", "input": "Hi", "store": True}
        )
    ).json()
    body = {
        "model": "scripted",
        "input": "And?",
        "previous_response_id": first["id"],
        "store": True,
    }
    second = (await client.post(RESPONSES, json=body)).json()
    assert second["status"] == "completed", second
    # The second prompt holds the first's prompt and answer: more tokens than both.
    used = first["usage"]["input_tokens"] + first["usage"]["output_tokens"]
    assert second["usage"]["input_tokens"] > used
    third = (
        await client.post(
            RESPONSES,
            json={
                "model": "scripted",
                "input": "More",
                "previous_response_id": second["id"],
            },
        )
    ).json()
    both = second["usage"]["input_tokens"] + second["usage"]["output_tokens"]
    assert third["usage"]["input_tokens"] > both  # the whole chain, in one read
    for previous, code in (
        ("resp_unknown", "previous_response_not_found"),
        (third["id"], "previous_response_not_found"),  # not stored
    ):
        body = {"model": "scripted", "input": "x", "previous_response_id": previous}
        refused = await client.post(RESPONSES, json=body)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert (error["param"], error["code"]) == ("previous_response_id", code)
    body = {"model": "scripted", "input": "x", "previous_response_id": first["id"]}
    assert (await client.post(RESPONSES, json=body, headers=BOB)).status_code == 400


async def test_a_running_previous_response_is_refused() -> None:
    engine = ScriptedEngine(tokens_per_s=200, never_finishes=True)
    async with _client(engine) as client:
        body = {"model": "scripted", "input": "Hi", "background": True}
        running = (await client.post(RESPONSES, json=body)).json()
        body = {
            "model": "scripted",
            "input": "x",
            "previous_response_id": running["id"],
        }
        refused = await client.post(RESPONSES, json=body)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "previous_response_in_progress"
        await client.post(f"{RESPONSES}/{running['id']}/cancel")


async def test_a_stored_response_that_fails_is_a_500_and_is_kept_failed() -> None:
    async with _client(ScriptedEngine(fail_at_step=2)) as client:
        answer = await client.post(
            RESPONSES, json={"model": "scripted", "input": "Hi", "store": True}
        )
        assert answer.status_code == 500
        assert answer.json()["error"]["code"] == "engine_error"
        rows = client.app.state.ledger.rows  # type: ignore[attr-defined]
        response_id = rows[-1].request_id
        kept = await ended(client, response_id)
        assert kept["status"] == "failed"
        assert kept["error"]["code"] == "engine_error"
        assert (rows[-1].status, rows[-1].end_state) == (500, EndState.ERRORED)
        streamed = await client.post(
            RESPONSES,
            json={"model": "scripted", "input": "Hi", "store": True, "stream": True},
        )
        assert b"response.failed" in streamed.content
        ledger = client.app.state.ledger  # type: ignore[attr-defined]
        await wait_until(lambda: len(ledger.rows) == 2, 5)
        assert (ledger.rows[-1].status, ledger.rows[-1].end_state) == (
            200,
            EndState.ERRORED,
        )


async def test_a_whole_answer_whose_client_left_is_a_499_in_the_ledger() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200, clock=clock)
    app = create_app(engine, ServerConfig(resume_grace_s=0.05), clock=clock)
    body = {"model": "scripted", "input": "Hi", "store": True}
    ex = Exchange(app, RESPONSES, body)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(ex.run())
        tokens = lambda: engine.stats().generated_tokens >= 3  # noqa: E731
        await on_clock(clock, anyio.sleep_forever, 0.005, tokens)
        ex.leave()
    assert ex.messages == []  # nothing was sent
    ledger = app.state.ledger
    left_at = clock.time()
    await on_clock(clock, anyio.sleep_forever, 0.01, lambda: len(ledger.rows) == 1)
    assert 0.05 <= round(clock.time() - left_at, 6) < 0.07  # the grace ran out
    rows = ledger.rows
    assert (rows[0].status, rows[0].end_state) == (CLIENT_CLOSED, EndState.ABORTED)
    assert rows[0].completion_tokens >= 3
    assert not app.state.resumable._whole  # nothing kept for the next request


async def test_a_retry_answered_whole_leaves_the_first_requests_row_as_it_was() -> None:
    engine = ScriptedEngine(tokens_per_s=100)
    app = create_app(engine, ServerConfig(resume_grace_s=5))
    body = {"model": "scripted", "input": "Hi", "store": True}
    key = [(b"idempotency-key", b"k-1")]
    first = Exchange(app, RESPONSES, body, extra_headers=key)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(first.run())
        await first.wait_for(lambda: engine.stats().generated_tokens >= 3)
        first.leave()
    retry = Exchange(app, RESPONSES, body, extra_headers=key)
    await retry.run()
    assert retry.messages[0]["status"] == 200
    answer = json.loads(retry.messages[1]["body"])
    assert text_of(answer) == DEFAULT_TEXT
    ledger = app.state.ledger
    await wait_until(lambda: len(ledger.rows) == 1, 5)
    row = ledger.rows[0]
    assert row.request_id == answer["id"]
    assert (row.status, row.end_state) == (CLIENT_CLOSED, EndState.FINISHED)


class _SlowFirstRecord(MemoryEventStore):
    """A store whose first ``set_record`` waits for ``gate``, as a shared
    store's always suspends there."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = False

    async def set_record(self, response_id: str, record: bytes) -> None:
        if not self.waiting:
            self.waiting = True
            await self.gate.wait()
        await super().set_record(response_id, record)


async def test_a_retry_attached_before_the_first_answer_exists_leaves_its_row() -> None:
    engine = ScriptedEngine(tokens_per_s=200)
    app = create_app(engine, ServerConfig(resume_grace_s=5))
    store = app.state.resumable.store = _SlowFirstRecord()
    body = {"model": "scripted", "input": "Hi", "store": True}
    key = [(b"idempotency-key", b"k-1")]
    first = Exchange(app, RESPONSES, body, extra_headers=key)
    retry = Exchange(app, RESPONSES, body, extra_headers=key)
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(first.run())
        await first.wait_for(lambda: store.waiting)  # its record is being kept
        tasks.create_task(retry.run())
        await retry.wait_for(lambda: engine.stats().generated_tokens >= 2)
        retry.leave()  # the retry's client leaves, the first's stays
        await retry.wait_for(lambda: retry.returned)
        store.gate.set()
    assert first.messages[0]["status"] == 200
    answer = json.loads(first.messages[1]["body"])
    ledger = app.state.ledger
    await wait_until(lambda: len(ledger.rows) == 1, 5)
    row = ledger.rows[0]
    assert row.request_id == answer["id"]
    assert (row.status, row.end_state) == (200, EndState.FINISHED)


STORE_TEXT = "Error 111 connecting to redis://:s3cret-pass@127.0.0.9:6379"
"""What a shared store's driver says when it fails: its URL, password and all.
None of it may reach a client."""


class _FailingRecord(MemoryEventStore):
    """A shared store that fails when a response's record is kept."""

    async def set_record(self, response_id: str, record: bytes) -> None:
        raise StoreError(STORE_TEXT)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_response_whose_record_cannot_be_kept_is_a_503_and_aborted(
    stream: bool,
) -> None:
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig(resume_grace_s=30))
    app.state.resumable.store = _FailingRecord()
    body = {"model": "scripted", "input": "Hi", "store": True, "stream": stream}
    ex = Exchange(app, RESPONSES, body)
    await ex.run()
    assert ex.messages[0]["status"] == 503
    error = json.loads(ex.messages[1]["body"])["error"]
    assert error["code"] == "resume_store_unavailable"
    assert "s3cret" not in ex.messages[1]["body"].decode()
    ledger = app.state.ledger
    await wait_until(lambda: len(ledger.rows) == 1, 5)  # not after the grace
    row = ledger.rows[0]
    assert row.end_state is EndState.ABORTED
    if not stream:  # a whole answer's row has its answer's status
        assert row.status == 503
    assert len(engine.stats().aborted_ids) == 1
    assert not app.state.resumable._whole


class _SlowSend(Exchange):
    async def _send(self, message: Any) -> None:
        await asyncio.sleep(0.01)  # as a real socket's send may
        await super()._send(message)


async def test_a_server_stopping_records_a_whole_answers_row_before_it_returns() -> (
    None
):
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig(resume_grace_s=5))
    body = {"model": "scripted", "input": "Hi", "store": True}
    ex = _SlowSend(app, RESPONSES, body)
    task = asyncio.get_running_loop().create_task(ex.run())
    await ex.wait_for(lambda: engine.stats().generated_tokens >= 3)
    await app.state.resumable.aclose()
    rows = app.state.ledger.rows
    await asyncio.wait_for(task, 5)
    assert [(row.status, row.end_state) for row in rows] == [
        (ex.messages[0]["status"], EndState.ABORTED)
    ]


async def test_a_background_stream_keeps_running_when_its_client_leaves() -> None:
    engine = ScriptedEngine(tokens_per_s=100)
    async with _client(engine, resume_grace_s=0.05) as client:
        body = {"model": "scripted", "input": "Hi", "background": True, "stream": True}
        async with client.stream("POST", RESPONSES, json=body) as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    response_id = json.loads(line[6:])["response"]["id"]
                    break
        final = await ended(client, response_id)  # well past the grace period
        assert final["status"] == "completed"
        assert text_of(final) == DEFAULT_TEXT


async def test_only_stored_responses_are_logged_whatever_the_resumable_default() -> (
    None
):
    async with _client(ScriptedEngine(), resumable_streams=True) as client:
        body = {"model": "scripted", "input": "Hi", "stream": True}
        plain = await client.post(RESPONSES, json=body)
        assert plain.status_code == 200
        assert b"\nid: " not in plain.content
        assert not plain.content.startswith(b"id: ")
        message = {
            "model": "scripted",
            "max_tokens": 8,
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        }
        streamed = await client.post("/v1/messages", json=message)
        assert streamed.status_code == 200
        assert b"id: " not in streamed.content.replace(b'"id":', b"")
        stored = await client.post(RESPONSES, json={**body, "store": True})
        assert stored.content.startswith(b"id: resp_")


async def test_a_whole_answer_survives_a_log_trimmed_under_its_reader() -> None:
    engine = ScriptedEngine(tokens_per_s=100000)
    async with _client(engine, max_log_bytes=1500) as client:
        for _ in range(3):
            body = {"model": "scripted", "input": "Hi", "store": True}
            answer = await client.post(RESPONSES, json=body)
            assert answer.status_code == 200, answer.text
            assert text_of(answer.json()) == DEFAULT_TEXT
            kept = await client.get(f"{RESPONSES}/{answer.json()['id']}")
            assert kept.json() == answer.json()
        # Following the log from its end after the trim is no resume.
        app = client.app  # type: ignore[attr-defined]
        assert app.state.resumable.resumes == 0
        ledger = app.state.ledger
        await wait_until(lambda: len(ledger.rows) == 3, 5)
        assert [row.resumed for row in ledger.rows] == [0, 0, 0]


async def test_a_long_input_string_is_one_item(client: httpx.AsyncClient) -> None:
    body = {"model": "scripted", "input": "a " * 1000, "max_output_tokens": 3}
    assert (await client.post(RESPONSES, json=body)).status_code == 200
    items = [{"role": "user", "content": "a"}] * 1025
    refused = await client.post(RESPONSES, json={**body, "input": items})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input"


class BrokenRecords(MemoryEventStore):
    """A store whose records and finishes fail as a shared store that went away."""

    async def record(self, response_id: str, owner: str) -> bytes | None:
        raise StoreError(STORE_TEXT)

    async def finish(self, response_id: str) -> None:
        await super().finish(response_id)
        raise StoreError(STORE_TEXT)


async def test_a_store_that_fails_is_a_503_and_still_gets_its_ledger_row() -> None:
    async with _client(ScriptedEngine(tokens_per_s=5000)) as client:
        app = client.app  # type: ignore[attr-defined]
        app.state.resumable.store = BrokenRecords()
        body = {"model": "scripted", "input": "x", "previous_response_id": "resp_1"}
        refused = await client.post(RESPONSES, json=body)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "resume_store_unavailable"
        assert "s3cret" not in refused.text
        got = await client.get(f"{RESPONSES}/resp_1")
        assert got.status_code == 503
        assert got.json()["error"]["code"] == "resume_store_unavailable"
        assert "s3cret" not in got.text
        stream = {"model": "scripted", "input": "Hi", "store": True, "stream": True}
        streamed = await client.post(RESPONSES, json=stream)
        assert b"response.completed" in streamed.content
        await wait_until(lambda: len(app.state.ledger.rows) == 2, 5)
        assert app.state.ledger.rows[-1].end_state == EndState.FINISHED


async def test_the_chat_cancel_route_does_not_cancel_a_response() -> None:
    engine = ScriptedEngine(tokens_per_s=200, never_finishes=True)
    async with _client(engine) as client:
        body = {"model": "scripted", "input": "Hi", "background": True}
        running = (await client.post(RESPONSES, json=body)).json()
        chat = await client.post(f"/v1/chat/completions/{running['id']}/cancel")
        assert chat.status_code == 404
        assert (await client.get(f"{RESPONSES}/{running['id']}")).json()[
            "status"
        ] == "in_progress"
        await client.post(f"{RESPONSES}/{running['id']}/cancel")


async def test_listing_input_items_is_a_400_naming_it(
    client: httpx.AsyncClient,
) -> None:
    refused = await client.get(f"{RESPONSES}/resp_0123/input_items")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "unsupported_endpoint"
    assert "input items" in error["message"]


async def test_a_400_from_the_chat_checks_names_each_apis_own_parameter(
    client: httpx.AsyncClient,
) -> None:
    long = await client.post(
        RESPONSES,
        json={"model": "scripted", "input": "Hi", "max_output_tokens": 99999999},
    )
    empty = await client.post(RESPONSES, json={"model": "scripted", "input": []})
    message = {
        "model": "scripted",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
        "stop_sequences": [""],
    }
    stop = await client.post("/v1/messages", json=message)
    assert (long.status_code, empty.status_code, stop.status_code) == (400,) * 3
    assert long.json()["error"]["param"] == "max_output_tokens"
    assert long.json()["error"]["message"].startswith("max_output_tokens ")
    assert empty.json()["error"]["param"] == "input"
    assert "'stop_sequences'" in stop.json()["error"]["message"]
