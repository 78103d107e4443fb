"""``serve --engine-process --workers 2``: the engine in a process of its own,
reached by two workers over a Unix socket; its aborts, the ledger both
workers write, a worker's death, a grammar compile that crashes, the engine's
death, readiness while it is away, and its restart.

The scripted engine runs in the engine process (paced, with a half-second
prefill), so that the tests control when a request is queued, in prefill or
decoding; two workers share it (the engine's stats count both), with Redis
and one PostgreSQL ledger that both write. The tests that crash or kill the
engine run last: the others see the engine they started with.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

import httpx
import psycopg
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.pg_read import read_rows
from sluicegate.server.ledger.rows import LedgerRow
from tests.postgres import PostgresCluster
from tests.redis_server import RedisServer
from tests.sse_lines import data_lines

from .servers import ServerProcess
from .wire import engine_stats
from .workers import client_on, engine_pid, eventually, worker_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 40}
STREAMS = 8
"""Streams in flight when the engine process is killed."""
LOAD = 32
"""Concurrent requests of the ledger test."""
LEASE_S = 3.0
"""The workers' ledger lease: a killed worker's open rows are marked
truncated by the other this long after its last renewal (three renewals)."""


@pytest.fixture(scope="module")
def ledger_url(postgres: PostgresCluster) -> str:
    return postgres.create_schema("engine_process")


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer,
    ledger_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("engine-process")
    text = folder / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    process = ServerProcess(
        "engine-process",
        [
            "--engine-process", "--workers", "2", "--redis", redis_server.url,
            "--engine", "scripted", "--scripted-text", str(text),
            "--scripted-rate", "40", "--scripted-max-running", "16",
            "--scripted-max-queued", "16", "--ledger", ledger_url,
            "--ledger-lease-s", str(LEASE_S), "--fault", "prefill-delay:0.5",
            "--fault", "grammar-crash",
        ],
        folder,
    )  # fmt: skip
    process.wait_healthy()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def _aborted(http: httpx.Client, request_id: str, *, cells_freed: bool = True) -> bool:
    def gone() -> bool:
        stats = engine_stats(http)
        return (
            request_id in stats["aborted_ids"]
            and request_id not in stats["running_ids"]
            and (stats["kv_cells_used"] == 0 or not cells_freed)
        )

    return eventually(gone)


def test_the_worker_streams_what_the_engine_process_generates(
    server: ServerProcess, http: httpx.Client
) -> None:
    assert engine_pid(server.pid) is not None
    answer = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    content = answer.json()["choices"][0]["message"]["content"]
    assert content  # the script's first tokens, detokenized in the worker
    assert "w0 w1 w2 w3".startswith(content)
    assert answer.json()["usage"]["completion_tokens"] == 3


def test_a_client_gone_while_decoding_aborts_in_the_engine_process(
    http: httpx.Client, server: ServerProcess
) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        body = {**CHAT, "max_tokens": 400, "stream": True}
        with client.stream("POST", "/v1/chat/completions", json=body) as live:
            response_id = json.loads(data_lines(live.iter_lines(), stop_after=2)[0])[
                "id"
            ]
    assert _aborted(http, f"{response_id}-0")


def test_a_client_gone_during_prefill_aborts_in_the_engine_process(
    http: httpx.Client, server: ServerProcess
) -> None:
    before = engine_stats(http)
    body = {**CHAT, "max_tokens": 400, "stream": True}
    with (
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as live,
    ):
        assert live.status_code == 200  # accepted: the prefill has begun
        new: set[str] = set()

        def started() -> bool:
            new.update(engine_stats(http)["running_ids"])
            return bool(new - set(before["running_ids"]))

        assert eventually(started)
        (request_id,) = new - set(before["running_ids"])
        assert engine_stats(http)["generated_tokens"] == before["generated_tokens"]
    assert _aborted(http, request_id)
    after = engine_stats(http)
    assert after["generated_tokens"] == before["generated_tokens"]  # no token


def test_a_client_gone_while_queued_aborts_in_the_engine_process(
    http: httpx.Client, server: ServerProcess
) -> None:
    body = {**CHAT, "max_tokens": 400, "stream": True}
    before = engine_stats(http)["aborted_requests"]
    clients = [httpx.Client(base_url=server.base_url, timeout=30) for _ in range(17)]
    streams = [c.stream("POST", "/v1/chat/completions", json=body) for c in clients]
    try:
        for stream in streams[:16]:  # every running slot
            assert stream.__enter__().status_code == 200
        assert eventually(lambda: engine_stats(http)["running"] == 16)
        with streams[16] as queued:  # accepted, waiting in the engine's queue
            assert queued.status_code == 200
            assert eventually(lambda: engine_stats(http)["queued"] == 1)
        assert eventually(
            lambda: (
                engine_stats(http)["queued"] == 0
                and engine_stats(http)["aborted_requests"] == before + 1
            )
        )
    finally:
        for stream in streams[:16]:
            stream.__exit__(None, None, None)
        for client in clients:
            client.close()
    assert eventually(lambda: engine_stats(http)["kv_cells_used"] == 0)
    assert engine_stats(http)["running"] == 0


def test_no_ledger_row_is_lost_when_both_workers_write_to_postgresql(
    server: ServerProcess, ledger_url: str
) -> None:
    body = {**CHAT, "max_tokens": 2}

    def ask(client: httpx.Client) -> tuple[str, int]:
        answer = client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["id"]), answer.json()["usage"]["completion_tokens"]

    # 16 connections at once, which the kernel spreads over the two workers
    with (
        httpx.Client(base_url=server.base_url, timeout=60) as client,
        ThreadPoolExecutor(16) as pool,
    ):
        asked = dict(pool.map(ask, [client] * LOAD))
    assert len(asked) == LOAD
    rows: dict[str, LedgerRow] = {}

    def all_ended() -> bool:  # each worker's writer thread commits on its own
        rows.update((r.request_id, r) for r in read_rows(ledger_url))
        return set(asked) <= set(rows)

    assert eventually(all_ended), set(asked) - set(rows)
    for request_id, tokens in asked.items():
        row = rows[request_id]
        assert (row.end_state, row.completion_tokens) == (EndState.FINISHED, tokens)
    with psycopg.connect(ledger_url) as db:
        servers = {
            server_id
            for request_id, server_id in db.execute(
                "SELECT request_id, server_id FROM requests"
            )
            if request_id in asked
        }
    assert len(servers) == 2  # both workers wrote


def _row(ledger_url: str, request_id: str) -> LedgerRow | None:
    rows = read_rows(ledger_url, request_id=request_id)
    return rows[0] if rows else None


def test_a_killed_worker_leaves_the_others_stream_and_the_engine_aborts_its_own(
    server: ServerProcess, ledger_url: str
) -> None:
    """SIGKILL of one worker mid-stream: the engine process aborts that
    worker's request (its connection closed) and frees its cells; the other
    worker's stream on the same engine runs to its end; the dead worker's row
    is marked truncated by the living one, the other's is finished."""
    body = {**CHAT, "max_tokens": 60, "stream": True}
    keep, keep_pid = client_on(server.base_url)
    doomed, doomed_pid = client_on(server.base_url, not_pid=keep_pid)
    # the engine's stats asked of the worker that lives (a connection the
    # killed one held would be reset)
    http, _ = client_on(server.base_url, pid=keep_pid)
    with (
        closing(http),
        closing(keep),
        closing(doomed),
        keep.stream("POST", "/v1/chat/completions", json=body) as kept,
    ):
        lines = kept.iter_lines()
        kept_id = json.loads(data_lines(lines, stop_after=3)[0])["id"]
        long = {**body, "max_tokens": 400}  # it cannot end before the kill
        with doomed.stream("POST", "/v1/chat/completions", json=long) as lost:
            lost_lines = lost.iter_lines()
            lost_id = json.loads(data_lines(lost_lines, stop_after=3)[0])["id"]
            os.kill(doomed_pid, signal.SIGKILL)
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                data_lines(lost_lines)  # cut: no [DONE], no error event
            assert _aborted(http, f"{lost_id}-0", cells_freed=False)
        tail = data_lines(lines)
        assert eventually(lambda: engine_stats(http)["kv_cells_used"] == 0)
    assert tail[-1] == "[DONE]"
    assert not [d for d in tail[:-1] if "error" in json.loads(d)]
    assert json.loads(tail[-2])["choices"][0]["finish_reason"] == "length"
    # the slot is served again (the next tests reach both workers)
    new_pids = worker_pids(server.base_url)
    assert keep_pid in new_pids
    assert doomed_pid not in new_pids

    def closed(request_id: str, state: EndState) -> bool:
        row = _row(ledger_url, request_id)
        return row is not None and row.end_state == state

    assert eventually(lambda: closed(lost_id, EndState.TRUNCATED))
    assert eventually(lambda: closed(kept_id, EndState.FINISHED))


def test_a_grammar_compile_that_crashes_takes_the_engine_process_not_a_worker(
    server: ServerProcess, http: httpx.Client
) -> None:
    """The scripted engine's ``grammar-crash`` fault: compiling a request's
    schema ends the engine process with SIGSEGV, as a native compiler that
    crashes would. The compile runs there, not in a worker: both workers live
    on, the request is refused with a status to retry, the streams in flight
    end with ``engine_crashed``, and the engine process is restarted."""
    engine = engine_pid(server.pid)
    workers = worker_pids(server.base_url)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = {
        **CHAT,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "a", "schema": schema},
        },
    }
    with (
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json={**CHAT, "max_tokens": 400, "stream": True},
        ) as live,
    ):
        lines = live.iter_lines()
        assert data_lines(lines, stop_after=2)  # streaming when the engine dies
        refused = http.post("/v1/chat/completions", json=body)
        tail = [json.loads(d) for d in data_lines(lines)]
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"]
    assert [c["error"]["code"] for c in tail if "error" in c] == ["engine_crashed"]
    assert eventually(lambda: engine_pid(server.pid) not in (None, engine))
    assert worker_pids(server.base_url) == workers  # no worker died
    assert eventually(
        lambda: http.post("/v1/chat/completions", json=CHAT).status_code == 200
    )


def _has_content(data: str) -> bool:
    """Whether an SSE ``data`` string is a chat chunk with some content."""
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def test_sigkill_of_the_engine_ends_every_stream_with_one_error_then_it_restarts(
    server: ServerProcess, http: httpx.Client, ledger_url: str
) -> None:
    engine = engine_pid(server.pid)
    assert engine is not None
    body = {**CHAT, "max_tokens": 400, "stream": True}
    clients = [
        httpx.Client(base_url=server.base_url, timeout=30) for _ in range(STREAMS)
    ]

    streaming = threading.Semaphore(0)  # released once per stream's first content

    def run(client: httpx.Client) -> tuple[list[dict[str, Any]], list[str]]:
        datas: list[str] = []
        seen_content = False
        with client.stream("POST", "/v1/chat/completions", json=body) as live:
            assert live.status_code == 200
            for line in live.iter_lines():
                if not line.startswith("data:"):
                    continue
                datas.append(line[5:].strip())
                if not seen_content and _has_content(datas[-1]):
                    seen_content = True
                    streaming.release()
        return [json.loads(d) for d in datas if d != "[DONE]"], datas

    first, first_pid = client_on(server.base_url)
    second, _ = client_on(server.base_url, not_pid=first_pid)
    workers = [first, second]
    # The supervisor stopped: it cannot restart the engine until SIGCONT, so
    # the test sees the workers while the engine is away, whatever the timing.
    os.kill(server.pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(STREAMS) as pool:
            futures = [pool.submit(run, c) for c in clients]
            assert eventually(lambda: engine_stats(http)["running"] == STREAMS)
            for _ in range(STREAMS):  # every stream has had a token: its row counts it
                assert streaming.acquire(timeout=30)
            os.kill(engine, signal.SIGKILL)
            results = [f.result(timeout=30) for f in futures]
        away = [
            (
                worker.post("/v1/chat/completions", json=CHAT),
                worker.get("/ready"),
                worker.get("/health"),
            )
            for worker in workers
        ]
    finally:
        os.kill(server.pid, signal.SIGCONT)
    for client in clients:
        client.close()
    ids = []
    for chunks, datas in results:
        assert "[DONE]" not in datas
        errors = [c["error"] for c in chunks if "error" in c]
        assert len(errors) == 1, datas[-3:]
        assert errors[0]["code"] == "engine_crashed"
        assert "error" in chunks[-1]
        deltas = [
            c
            for c in chunks
            if c.get("choices") and c["choices"][0]["delta"].get("content")
        ]
        ids.append((chunks[0]["id"], len(deltas)))
    # Until the engine is back, a new request to either worker is refused with
    # a status to retry, the worker is not ready, and it is alive.
    for refused, not_ready, alive in away:
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"]
        assert not_ready.status_code == 503, not_ready.text
        assert not_ready.headers["retry-after"]
        assert not_ready.json()["error"]["code"] == "engine_unavailable"
        assert alive.status_code == 200
        assert alive.json()["status"] == "engine_restarting"
    assert eventually(lambda: engine_pid(server.pid) not in (None, engine))
    for worker in workers:

        def ready(worker: httpx.Client = worker) -> bool:
            return bool(worker.get("/ready").status_code == 200)

        assert eventually(ready)
        assert worker.get("/health").json()["status"] == "ok"
        assert worker.post("/v1/chat/completions", json=CHAT).status_code == 200
        worker.close()
    rows = {row.request_id: row for row in read_rows(ledger_url)}
    for response_id, streamed in ids:
        row = rows[response_id]  # from whichever worker streamed it
        assert row.end_state == EndState.ERRORED
        assert row.completion_tokens >= streamed > 0  # streamed before the crash
