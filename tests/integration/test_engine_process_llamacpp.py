"""The real model in an engine process of its own: an abort across the socket
and a SIGKILL of the engine process mid-stream.

The abort test is ``test_disconnect.py``'s, run against a server whose
llama.cpp engine is in its own process (``--engine-process``): the same
contract (aborted within 1 s or a few steps, KV cells freed) holds across the
IPC (queue and prefill aborts: ``test_engine_process.py``, scripted). The kill
test runs last (the engine then loads the model again).
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from . import test_disconnect as disconnect
from .servers import N_CTX, PARALLEL, ServerProcess, StartServer
from .wire import NO_END_TOKENS, engine_stats
from .workers import engine_pid, eventually

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def remote_server(start_server: StartServer, ledger_path: Path) -> ServerProcess:
    return start_server(
        "engine-process-llamacpp",
        "--log-level", "warning", "--engine", "llamacpp", "--engine-process",
        "--n-ctx", str(N_CTX), "--parallel", str(PARALLEL),
        "--ledger", str(ledger_path),
    )  # fmt: skip


@pytest.fixture(scope="module")
def base_url(remote_server: ServerProcess) -> str:
    return remote_server.base_url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


test_closing_a_stream_after_the_first_token_aborts_the_engine = (
    disconnect.test_closing_a_stream_after_the_first_token_aborts_the_engine
)


def _has_content(data: str) -> bool:
    """Whether an SSE ``data`` string is a chat chunk with some content."""
    if data == "[DONE]":
        return False
    choices = json.loads(data).get("choices") or [{}]
    return bool(choices[0].get("delta", {}).get("content"))


def test_sigkill_of_the_engine_process_ends_each_stream_in_one_error(
    remote_server: ServerProcess, http: httpx.Client, ledger_path: Path
) -> None:
    from sluicegate.server.ledger.ledger import read_rows

    engine = engine_pid(remote_server.pid)
    assert engine is not None
    body = {**disconnect.STORY, "max_tokens": 512, "stream": True}

    streaming = threading.Semaphore(0)  # released once per stream's first content

    def run() -> list[dict[str, Any]]:
        datas: list[str] = []
        seen_content = False
        with (
            httpx.Client(base_url=remote_server.base_url, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as live,
        ):
            assert live.status_code == 200
            for line in live.iter_lines():
                if not line.startswith("data:"):
                    continue
                datas.append(line[5:].strip())
                if not seen_content and _has_content(datas[-1]):
                    seen_content = True
                    streaming.release()
        assert "[DONE]" not in datas
        return [json.loads(d) for d in datas]

    before = engine_stats(http)["generated_tokens"]
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = [pool.submit(run) for _ in range(PARALLEL)]
        assert eventually(lambda: engine_stats(http)["running"] == PARALLEL)
        assert eventually(lambda: engine_stats(http)["generated_tokens"] > before)
        for _ in range(PARALLEL):  # every stream has had a token: its row counts it
            assert streaming.acquire(timeout=60)
        os.kill(engine, signal.SIGKILL)
        streams = [f.result(timeout=60) for f in futures]
    for chunks in streams:
        errors = [c["error"] for c in chunks if "error" in c]
        assert [e["code"] for e in errors] == ["engine_crashed"]
        assert "error" in chunks[-1]
    assert eventually(lambda: engine_pid(remote_server.pid) not in (None, engine))
    assert eventually(
        lambda: http.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                  "logit_bias": NO_END_TOKENS},
        ).status_code == 200,
        give_up_s=120,
    )  # fmt: skip
    rows = {r.request_id: r for r in read_rows(ledger_path)}
    for chunks in streams:
        row = rows[chunks[0]["id"]]
        assert str(row.end_state) == "errored"
        assert row.completion_tokens > 0
