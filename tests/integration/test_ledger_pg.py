"""Two replicas on one PostgreSQL ledger; kill -9 one mid-stream, lose no row.

Replica A streams forever (``never-finishes``), replica B finishes its requests;
both write one database. A gets SIGKILL while its streams run (no drain, no
``finally``): each of its requests had its ``open`` row from admission and its
token counts written every second, so once A's lease expires, B (still
running) marks them ``truncated``, with what they had delivered. Every row of
both replicas is there, each under its own server's id.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow
from sluicegate.server.ledger.pg_read import read_rows

from .servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STREAMS = 2
LEASE_S = 2.0
BODY = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}


def _read(base_url: str, ids: list[str], deltas: list[int], i: int) -> None:
    """Stream one chat completion until the connection breaks."""
    try:
        with (
            httpx.Client(base_url=base_url, timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=BODY) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    ids[i] = json.loads(line[len("data: ") :])["id"]
                    deltas[i] += 1
    except httpx.HTTPError:
        pass  # the server was killed


def _rows_once_marked(url: str, expected: int) -> list[LedgerRow]:
    deadline = time.monotonic() + 10 * LEASE_S
    while True:
        rows = read_rows(url)
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def _server_ids(url: str) -> dict[str, str]:
    with psycopg.connect(url) as db:
        return dict(db.execute("SELECT request_id, server_id FROM requests"))


def _replica(name: str, url: str, tmp_path: Path, *extra: str) -> ServerProcess:
    args = [
        *("--engine", "scripted", "--scripted-rate", "20", *extra),
        *("--ledger", url, "--ledger-lease-s", str(LEASE_S)),
        *("--log-level", "warning"),
    ]
    server = ServerProcess(name, args, tmp_path)
    server.wait_healthy()
    return server


def test_a_killed_replicas_running_requests_are_marked_by_the_other(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doomed = _replica("doomed", postgres_url, tmp_path, "--fault", "never-finishes")
    survivor = _replica("survivor", postgres_url, tmp_path)
    try:
        with httpx.Client(timeout=30) as client:
            finished = [
                client.post(f"{survivor.base_url}/v1/chat/completions", json=BODY)
                for _ in range(2)
            ]
            rejected = client.post(
                f"{doomed.base_url}/v1/chat/completions", json={**BODY, "n": 0}
            )
        assert [r.status_code for r in finished] == [200, 200]
        assert rejected.status_code == 400
        ids, deltas = [""] * STREAMS, [0] * STREAMS
        threads = [
            threading.Thread(target=_read, args=(doomed.base_url, ids, deltas, i))
            for i in range(STREAMS)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while min(deltas) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)  # at least one progress write (every 1 s)
        doomed.process.kill()
        doomed.process.wait(10)
        for thread in threads:
            thread.join(10)
        assert all(ids)
        assert min(deltas) >= 5
        rows = _rows_once_marked(postgres_url, 3 + STREAMS)
    finally:
        doomed.stop()
        survivor.stop()
    states = sorted((r.end_state, r.status) for r in rows)
    assert states == sorted(
        [(EndState.FINISHED, 200)] * 2
        + [(EndState.REJECTED, 400)]
        + [(EndState.TRUNCATED, 200)] * STREAMS
    )
    by_id = {row.request_id: row for row in rows}
    for rid, delivered in zip(ids, deltas, strict=True):
        row = by_id[rid]
        assert row.end_state is EndState.TRUNCATED
        assert row.first_token_at is not None
        # Counted at the last progress write, over 1 s after each stream had its
        # role chunk and 4 or more content chunks (a token each at least).
        assert row.completion_tokens >= 4, (row, delivered)
    owners = _server_ids(postgres_url)
    rejected_id = next(r.request_id for r in rows if r.end_state is EndState.REJECTED)
    doomed_ids = {owners[rid] for rid in [*ids, rejected_id]}
    survivor_ids = {
        owners[r.request_id] for r in rows if r.end_state is EndState.FINISHED
    }
    assert len(doomed_ids) == len(survivor_ids) == 1
    assert doomed_ids != survivor_ids
    assert main(["usage", "--ledger", postgres_url]) == 0
    out = capsys.readouterr().out
    assert "truncated" in out
    assert "finished" in out
