"""State stores under faults, on real processes: Redis killed, restarted, full;
a usage number past 64 bits on its way to the ledger.

Each Redis test starts a ``redis-server`` of its own (``tests/redis_server.py``,
as ``scripts/install-system-deps`` installs it), so that it may kill it, start
it again and cap its memory without touching the session's. The server under
test is a real ``sluicegate serve`` process, its ledger a file the test reads
back; its streams are resumable (``--resumable``) and paced (the scripted engine
at 20 tokens/s), so that each fault lands in the middle of one.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from sluicegate.core.wire.chunks import MAX_INT
from sluicegate.server.ledger.ledger import LedgerRow, read_rows
from tests.redis_server import BINARY, RedisServer

from .gateway import FakeUpstream, Reply, chat_chunk, usage_chunk
from .servers import ServerProcess

pytestmark = pytest.mark.integration

BODY = {
    "messages": [{"role": "user", "content": "Say hi"}],
    "max_tokens": 200,
    "stream": True,
}
ROW_WITHIN_S = 10.0
"""How long a row may take to reach the ledger file (a few ms when idle)."""


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of this test's own, stopped at its end."""
    if shutil.which(BINARY) is None:
        pytest.skip("redis-server is not installed (scripts/install-system-deps)")
    root = tmp_path / "redis"
    root.mkdir()
    server = RedisServer(root, "--maxmemory-policy", "noeviction")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """Start ``sluicegate serve`` with a ledger file; stopped at the end."""
    started: list[ServerProcess] = []

    def start(*args: str) -> ServerProcess:
        ledger = ("--ledger", str(tmp_path / "ledger.sqlite3"))
        server = ServerProcess(f"server{len(started)}", [*ledger, *args], tmp_path)
        started.append(server)
        server.wait_healthy()
        return server

    yield start
    for server in started:
        server.stop()


def _resumable_server(
    serve: Callable[..., ServerProcess], redis: RedisServer, tmp_path: Path
) -> ServerProcess:
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    return serve(
        "--engine", "scripted", "--scripted-text", str(text),
        "--scripted-rate", "20", "--redis", redis.url, "--resumable",
    )  # fmt: skip


def _stream_with_fault(
    server: ServerProcess, fault: Callable[[], None], after_events: int = 4
) -> tuple[list[str], str]:
    """POST a resumable stream, run ``fault`` once ``after_events`` data lines
    came, read the rest; returns every data line and the response id. The body
    must end cleanly (httpx raises on a broken chunked body)."""
    data: list[str] = []
    with (
        httpx.Client(timeout=30) as http,
        http.stream("POST", f"{server.base_url}/v1/chat/completions", json=BODY) as r,
    ):
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                data.append(line.removeprefix("data: "))
                if len(data) == after_events:
                    fault()
    response_id = json.loads(data[0])["id"]
    return data, response_id


def _row(tmp_path: Path, request_id: str) -> LedgerRow:
    """The ended row of ``request_id`` in the ledger file (waits for it)."""
    deadline = time.monotonic() + ROW_WITHIN_S
    while True:
        rows = {row.request_id: row for row in read_rows(tmp_path / "ledger.sqlite3")}
        if request_id in rows:
            return rows[request_id]
        if time.monotonic() > deadline:
            pytest.fail(f"no ended row for {request_id} in {sorted(rows)}")
        time.sleep(0.05)


def _open_rows(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        (count,) = db.execute(
            "SELECT COUNT(*) FROM requests WHERE end_state = 'open'"
        ).fetchone()
    db.close()
    return int(count)


def _one_error_at_the_end(data: list[str]) -> dict[str, object]:
    """The stream's one error event: its last, after content, with no [DONE]."""
    assert "[DONE]" not in data
    errors = [json.loads(d)["error"] for d in data if '"error"' in d]
    assert len(errors) == 1, data[-3:]
    assert '"error"' in data[-1]
    assert any('"content"' in d for d in data[:-1])  # it came mid-stream
    error: dict[str, object] = errors[0]
    assert error["type"] == "server_error"
    assert "127.0.0.1" not in str(error["message"])  # the store's text stays in
    return error


def _finishes(server: ServerProcess) -> None:
    """A resumable stream on ``server`` now runs to its ``[DONE]``."""
    body = {**BODY, "max_tokens": 5}
    answer = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 200
    assert answer.text.rstrip().endswith("data: [DONE]")


@pytest.mark.slow
def test_redis_killed_mid_stream_ends_it_with_one_error_then_restarted_serves(
    redis: RedisServer, serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = _resumable_server(serve, redis, tmp_path)
    data, response_id = _stream_with_fault(server, redis.kill)
    assert _one_error_at_the_end(data)["code"] == "resume_store_unavailable"
    row = _row(tmp_path, response_id)
    assert (row.status, row.end_state) == (200, "errored")
    assert row.completion_tokens >= 3
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    refused = httpx.post(f"{server.base_url}/v1/chat/completions", json=BODY)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "resume_store_unavailable"
    assert refused.headers["retry-after"] == "1"
    redis.start()  # the same port, empty
    _finishes(server)


@pytest.mark.slow
def test_redis_restarted_empty_mid_stream_ends_it_with_one_error(
    redis: RedisServer, serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """A restart faster than a flush, as a restart without persistence looks to
    the server: the log is gone from Redis (FLUSHALL is that, without the
    timing), never fed into nothing."""
    server = _resumable_server(serve, redis, tmp_path)

    def restart_empty() -> None:
        assert redis.command(b"FLUSHALL").startswith(b"+OK")

    data, response_id = _stream_with_fault(server, restart_empty)
    assert _one_error_at_the_end(data)["code"] == "resume_store_unavailable"
    assert _row(tmp_path, response_id).end_state == "errored"
    _finishes(server)


@pytest.mark.slow
def test_redis_full_answers_503_resume_store_full_before_the_first_byte(
    redis: RedisServer, serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = _resumable_server(serve, redis, tmp_path)
    # Any write now finds the memory over maxmemory (noeviction).
    assert redis.command(b"CONFIG", b"SET", b"maxmemory", b"1").startswith(b"+OK")
    for _ in range(2):  # and again: nothing was left half made
        refused = httpx.post(
            f"{server.base_url}/v1/chat/completions", json=BODY, timeout=30
        )
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert (error["code"], error["type"]) == ("resume_store_full", "server_error")
    # Each refusal has its row, closed (none stays open).
    deadline = time.monotonic() + ROW_WITHIN_S
    while len(rows := read_rows(tmp_path / "ledger.sqlite3")) < 2:
        assert time.monotonic() < deadline, rows
        time.sleep(0.05)
    assert [(row.status, row.end_state) for row in rows] == [(503, "rejected")] * 2
    assert _open_rows(tmp_path) == 0
    assert redis.command(b"CONFIG", b"SET", b"maxmemory", b"0").startswith(b"+OK")
    _finishes(server)


@pytest.mark.slow
def test_redis_full_mid_stream_ends_it_with_one_resume_store_full_error(
    redis: RedisServer, serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = _resumable_server(serve, redis, tmp_path)

    def fill() -> None:
        reply = redis.command(b"CONFIG", b"SET", b"maxmemory", b"1")
        assert reply.startswith(b"+OK")

    data, response_id = _stream_with_fault(server, fill)
    assert _one_error_at_the_end(data)["code"] == "resume_store_full"
    row = _row(tmp_path, response_id)
    assert (row.status, row.end_state) == (200, "errored")


def test_a_usage_past_64_bits_is_written_and_the_ledger_goes_on(
    serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """An upstream's usage of 10^19 tokens each way (their sum past 64 bits)
    ended the stream with an encoder error and killed the ledger's writer:
    that row stayed open and every later row was lost."""
    huge = 10**19

    def reply(body: dict[str, object]) -> Reply:
        prompt = huge if body["messages"] == BODY["messages"] else 3
        return Reply(
            events=[
                chat_chunk(0, "hi"),
                chat_chunk(0, None, "stop"),
                usage_chunk(prompt, prompt),
                "[DONE]",
            ]
        )

    with FakeUpstream(reply) as upstream:
        server = serve(
            "--upstream", upstream.url, "--upstream-model", "fake",
            "--log-level", "warning",
        )  # fmt: skip
        url = f"{server.base_url}/v1/chat/completions"
        ids = []
        for content in ("Say hi", "again"):
            body = {
                "model": "fake",
                "messages": [{"role": "user", "content": content}],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            answer = httpx.post(url, json=body, timeout=30)
            assert answer.status_code == 200
            data = [
                line.removeprefix("data: ")
                for line in answer.text.splitlines()
                if line.startswith("data: ")
            ]
            assert data[-1] == "[DONE]"
            assert not any('"error"' in d for d in data)
            usage = json.loads(data[-2])["usage"]
            assert all(0 <= n <= MAX_INT for n in usage.values())
            ids.append(json.loads(data[0])["id"])
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    first, second = (_row(tmp_path, rid) for rid in ids)
    assert first.end_state == second.end_state == "finished"
    assert 0 <= first.prompt_tokens <= MAX_INT
    assert first.usage_estimated
    assert (second.prompt_tokens, second.completion_tokens) == (3, 3)
    assert "sluicegate_ledger_write_errors_total 0.0" in metrics.splitlines()


@pytest.mark.slow
def test_a_reader_on_another_replica_gets_the_same_one_error_when_redis_dies(
    redis: RedisServer, serve: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    producer = _resumable_server(serve, redis, tmp_path)
    other = _resumable_server(serve, redis, tmp_path)
    with httpx.Client(timeout=30) as http:
        url = f"{producer.base_url}/v1/chat/completions"
        with http.stream("POST", url, json=BODY) as first:
            assert first.status_code == 200
            lines = first.iter_lines()
            cursor = next(line for line in lines if line.startswith("id: "))
            cursor = next(line for line in lines if line.startswith("id: "))
        last_id = cursor.removeprefix("id: ")
        response_id = last_id.rsplit(".", 1)[0]
        resume = f"{other.base_url}/v1/chat/completions/{response_id}/events"
        data: list[str] = []
        with http.stream("GET", resume, headers={"Last-Event-ID": last_id}) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line.removeprefix("data: "))
                    if len(data) == 3:  # live, read through Redis
                        redis.kill()
    assert _one_error_at_the_end(data)["code"] == "resume_store_unavailable"
    row = _row(tmp_path, response_id)
    assert (row.status, row.end_state) == (200, "errored")
