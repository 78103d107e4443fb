"""``serve --engine-process``: the engine in a process of its own, reached by
the worker over a Unix socket; its aborts, its death and its restart.

The scripted engine runs in the engine process (paced, with a half-second
prefill), so that the tests control when a request is queued, in prefill or
decoding; one worker (``--workers 1``), so no Redis. The test that
kills the engine runs last: the others then see a fresh engine.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from .servers import ServerProcess
from .wire import engine_stats
from .workers import engine_pid, eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 40}
STREAMS = 8
"""Streams in flight when the engine process is killed."""


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def server(
    ledger_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("engine-process")
    text = folder / "text.txt"
    text.write_text(" ".join(f"w{i}" for i in range(400)))
    process = ServerProcess(
        "engine-process",
        [
            "--engine-process", "--engine", "scripted", "--scripted-text", str(text),
            "--scripted-rate", "40", "--scripted-max-running", "16",
            "--scripted-max-queued", "16", "--ledger", str(ledger_path),
            "--fault", "prefill-delay:0.5",
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


def _data(lines: Iterator[str], stop_after: int | None = None) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line.startswith("data:"):
            out.append(line[5:].strip())
            if stop_after is not None and len(out) >= stop_after:
                break
    return out


def _aborted(http: httpx.Client, request_id: str) -> bool:
    def gone() -> bool:
        stats = engine_stats(http)
        return (
            request_id in stats["aborted_ids"]
            and request_id not in stats["running_ids"]
            and stats["kv_cells_used"] == 0
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
            response_id = json.loads(_data(live.iter_lines(), stop_after=2)[0])["id"]
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


def _chunks(response: httpx.Response) -> tuple[list[dict[str, Any]], list[str]]:
    datas = _data(response.iter_lines())
    parsed = [json.loads(d) for d in datas if d != "[DONE]"]
    return parsed, datas


def test_sigkill_of_the_engine_ends_every_stream_with_one_error_then_it_restarts(
    server: ServerProcess, http: httpx.Client, ledger_path: Path
) -> None:
    engine = engine_pid(server.pid)
    assert engine is not None
    body = {**CHAT, "max_tokens": 400, "stream": True}
    clients = [
        httpx.Client(base_url=server.base_url, timeout=30) for _ in range(STREAMS)
    ]

    def run(client: httpx.Client) -> tuple[list[dict[str, Any]], list[str]]:
        with client.stream("POST", "/v1/chat/completions", json=body) as live:
            assert live.status_code == 200
            return _chunks(live)

    with ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(run, c) for c in clients]
        assert eventually(lambda: engine_stats(http)["running"] == STREAMS)
        assert eventually(lambda: engine_stats(http)["generated_tokens"] > STREAMS * 3)
        os.kill(engine, signal.SIGKILL)
        results = [f.result(timeout=30) for f in futures]
    refused = http.post("/v1/chat/completions", json=CHAT)
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
    # Until the engine is back, a new request is refused with a status to retry.
    if refused.status_code != 200:
        assert refused.status_code == 503
        assert refused.headers["retry-after"]
    assert eventually(lambda: engine_pid(server.pid) not in (None, engine))
    assert eventually(
        lambda: http.post("/v1/chat/completions", json=CHAT).status_code == 200
    )
    db = sqlite3.connect(ledger_path)
    try:
        rows = {
            rid: (state, tokens)
            for rid, state, tokens in db.execute(
                "SELECT request_id, end_state, completion_tokens FROM requests"
            )
        }
    finally:
        db.close()
    for response_id, streamed in ids:
        state, tokens = rows[response_id]
        assert state == "errored"
        assert tokens >= streamed > 0  # the tokens streamed before the crash
