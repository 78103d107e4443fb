"""SIGTERM during streaming: streams end in band, new work gets 503, rows are kept.

A scripted server whose sequences never finish gets SIGTERM while two streams
run: readiness and new requests turn 503 with ``Retry-After`` during the grace
period, both streams then end with the in-band ``server_shutdown`` error (the
``openai`` SDK raises on it), the process exits with its KV cells free, and the
SQLite ledger holds one row per request, agreeing with what the clients saw.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import read_rows

from .servers import StartServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hi"}]


def _stream(base_url: str, outcome: list[object], started: threading.Event) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    try:
        stream = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Hi"}],
            stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                started.set()
        outcome.append("finished")
    except openai.APIError as exc:
        outcome.append(exc)
    finally:
        client.close()


def test_sigterm_mid_stream_ends_streams_in_band_and_keeps_every_row(
    start_server: StartServer, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    server = start_server(
        "draining",
        *("--engine", "scripted", "--fault", "never-finishes"),
        *("--scripted-rate", "50", "--grace-s", "1.5", "--ledger", str(ledger)),
        *("--retry-after-s", "3"),
    )
    outcomes: list[list[object]] = [[], []]
    started = [threading.Event(), threading.Event()]
    threads = [
        threading.Thread(target=_stream, args=(server.base_url, o, s))
        for o, s in zip(outcomes, started, strict=True)
    ]
    for thread in threads:
        thread.start()
    assert all(s.wait(10) for s in started)
    server.process.send_signal(signal.SIGTERM)
    with httpx.Client(base_url=server.base_url, timeout=5) as http:
        for _ in range(100):  # the drain starts on uvicorn's next tick (0.1 s)
            ready = http.get("/ready")
            if ready.status_code == 503:
                break
            time.sleep(0.01)
        late = http.post("/v1/chat/completions", json={"messages": HELLO})
    # docs/redis.md and docs/security.md named --retry-after-s before it existed
    assert (ready.status_code, ready.headers["retry-after"]) == (503, "3")
    assert (late.status_code, late.headers["retry-after"]) == (503, "3")
    for thread in threads:
        thread.join(15)
    try:
        server.process.wait(15)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server did not exit:\n{server.log_text()}")
    for outcome in outcomes:
        assert len(outcome) == 1
        assert isinstance(outcome[0], openai.APIError), outcome
        assert "shutting down" in str(outcome[0])
    assert "stopped: 0 KV cells used, 0 running, 0 queued" in server.log_text()
    rows = read_rows(ledger)
    states = sorted((r.end_state, r.status) for r in rows)
    assert states == sorted(
        [(EndState.ERRORED, 200), (EndState.ERRORED, 200), (EndState.REJECTED, 503)]
    )
    assert all(r.completion_tokens > 0 for r in rows if r.status == 200)
