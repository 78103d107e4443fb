"""The real model in an engine process of its own, reached by two workers:
shared streaming cases, aborts across the socket while a request waits in the
engine's queue, is in its prefill and decodes, and a SIGKILL of the engine
process mid-stream.

``serve --workers 2`` puts llama.cpp in a process of its own; each worker
detokenizes, holds back stop strings and writes frames. The cheapest of the
shared cases that reach each of those (chunks, text, stop strings, headers)
and the prefill and decode aborts are the one-process server's tests
(``test_chunks.py``, ``test_disconnect.py``...), run against this server: the
same contracts (aborted within 1 s or a few steps, KV cells freed) hold
across the IPC, from whichever worker a connection reaches. The kill test
runs last (the engine then loads the model again).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.redis_server import RedisServer

from . import test_chunks as chunk_cases
from . import test_disconnect as disconnect
from . import test_headers as headers
from . import test_openai_sdk as openai_sdk
from . import test_stop_strings as stop_strings
from . import test_text as text
from .conftest import IDLE_TIMEOUT_S
from .servers import N_CTX, PARALLEL, ServerProcess, StartServer
from .wire import NO_END_TOKENS, RawExchange, engine_stats, wait_until
from .workers import engine_pid, eventually

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def ledger_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ledger") / "ledger.sqlite3"


@pytest.fixture(scope="module")
def remote_server(
    start_server: StartServer, ledger_path: Path, redis_server: RedisServer
) -> ServerProcess:
    return start_server(
        "engine-process-llamacpp",
        "--log-level", "warning", "--engine", "llamacpp", "--workers", "2",
        "--redis", redis_server.url, "--n-ctx", str(N_CTX),
        "--parallel", str(PARALLEL), "--ledger", str(ledger_path),
    )  # fmt: skip


@pytest.fixture(scope="module")
def base_url(remote_server: ServerProcess) -> str:
    return remote_server.base_url


@pytest.fixture(scope="module")
def http(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, timeout=60) as client:
        yield client


@pytest.fixture(autouse=True)
def engine_is_idle_after_test(http: httpx.Client) -> Iterator[None]:
    """As for the one-process server: every stream a test opened has ended."""
    yield
    idle, _ = wait_until(
        http, disconnect.idle, started_s=time.monotonic(), give_up_s=IDLE_TIMEOUT_S
    )
    assert idle is not None, f"engine busy after the test: {engine_stats(http)}"


# The shared cases, through a worker and the engine process: those that cost
# least and reach each part a worker runs (frames, usage and [DONE], a choice
# per index, byte tokens joined into whole characters, a stop string held
# back, the stream headers).
test_tiny_max_tokens_streams_every_token = (
    chunk_cases.test_tiny_max_tokens_streams_every_token
)
test_length_finish_is_the_last_choice_chunk = (
    chunk_cases.test_length_finish_is_the_last_choice_chunk
)
test_done_is_sent_once_after_both_choices_finish = (
    chunk_cases.test_done_is_sent_once_after_both_choices_finish
)
test_raw_stream_ends_with_done_after_usage = (
    openai_sdk.test_raw_stream_ends_with_done_after_usage
)


def test_characters_split_across_byte_tokens_stream_whole(http: httpx.Client) -> None:
    text.test_characters_split_across_byte_tokens_stream_whole(http, 24)


def test_held_back_tail_is_flushed_before_the_finish_chunk(http: httpx.Client) -> None:
    stop_strings.test_held_back_tail_is_flushed_before_the_finish_chunk(http, 2)


def test_stream_headers_are_proxy_safe_and_never_compressed(
    http: httpx.Client,
) -> None:
    headers.test_stream_headers_are_proxy_safe_and_never_compressed(http, CHAT)


# The aborts across the IPC.
test_closing_a_stream_after_the_first_token_aborts_the_engine = (
    disconnect.test_closing_a_stream_after_the_first_token_aborts_the_engine
)
test_closing_during_a_long_prefill_aborts_before_any_token = (
    disconnect.test_closing_during_a_long_prefill_aborts_before_any_token
)


def test_a_client_gone_while_queued_aborts_in_the_engine_process(
    base_url: str, http: httpx.Client
) -> None:
    """Every sequence of the engine is taken; one more request waits in its
    queue, and its client leaves: the engine drops it from the queue, and the
    running ones go on."""
    before, _ = wait_until(
        http,
        disconnect.idle,
        started_s=time.monotonic(),
        give_up_s=disconnect.GIVE_UP_S,
    )
    assert before is not None, engine_stats(http)
    # 512 tokens each: every request's cells fit at once, so the one more
    # waits for a sequence slot, not for cells
    body = {**disconnect.STORY, "max_tokens": 512, "stream": True}
    with contextlib.ExitStack() as held:
        started_s = time.monotonic()
        for _ in range(PARALLEL):
            running = held.enter_context(RawExchange(base_url, CHAT, body))
            assert running.read_response().status_code == 200
        busy, _ = wait_until(
            http,
            lambda s: s["running"] == PARALLEL,
            started_s=started_s,
            give_up_s=disconnect.GIVE_UP_S,
        )
        assert busy is not None, engine_stats(http)
        with RawExchange(base_url, CHAT, body) as waiting:
            assert waiting.read_response().status_code == 200  # in the queue
            queued, _ = wait_until(
                http,
                lambda s: s["queued"] == 1,
                started_s=waiting.sent_at_s,
                give_up_s=disconnect.GIVE_UP_S,
            )
            assert queued is not None, engine_stats(http)
            closed_at_s = waiting.close()
        at_close = engine_stats(http)
        stats, elapsed_s = wait_until(
            http,
            lambda s: (
                s["queued"] == 0
                and s["aborted_requests"] == before["aborted_requests"] + 1
            ),
            started_s=closed_at_s,
            give_up_s=disconnect.GIVE_UP_S,
        )
        assert stats is not None, engine_stats(http)
        steps = stats["steps"] - at_close["steps"]
        assert (
            elapsed_s <= disconnect.ABORT_WITHIN_S
            or steps <= disconnect.STEPS_AFTER_CLOSE
        ), (elapsed_s, steps, stats)
        (request_id,) = set(stats["aborted_ids"]) - set(before["aborted_ids"])
        assert request_id not in queued["running_ids"]  # it never ran
        assert set(stats["running_ids"]) == set(queued["running_ids"])
    # the running streams' clients leave too: every cell is freed
    freed, _ = wait_until(
        http,
        disconnect.idle,
        started_s=time.monotonic(),
        give_up_s=disconnect.GIVE_UP_S,
    )
    assert freed is not None, engine_stats(http)


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
