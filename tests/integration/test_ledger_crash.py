"""kill -9 mid-stream: the next server marks every running request ``truncated``.

A scripted server streams to several clients, then gets SIGKILL (no drain, no
shutdown, no ``finally``). Each request had its ``open`` row from admission and
its token counts written every second; a new server on the same ledger file marks
them ``truncated``, with what they had delivered, and ``sluicegate usage`` shows
them.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.server.ledger.ledger import LedgerRow, read_rows

from .servers import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STREAMS = 4


def _read(base_url: str, ids: list[str], deltas: list[int], i: int) -> None:
    """Stream one chat completion until the connection breaks."""
    body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
    try:
        with (
            httpx.Client(base_url=base_url, timeout=30) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[len("data: ") :])
                    ids[i] = chunk["id"]
                    deltas[i] += 1
    except httpx.HTTPError:
        pass  # the server was killed


def _rows_once_marked(path: Path, expected: int) -> list[LedgerRow]:
    deadline = time.monotonic() + 10
    while True:
        rows = read_rows(path)
        if len(rows) >= expected or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_a_killed_servers_running_requests_are_marked_truncated_on_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    args = [
        *("--engine", "scripted", "--fault", "never-finishes"),
        *("--scripted-rate", "20", "--ledger", str(ledger), "--log-level", "warning"),
    ]
    first = ServerProcess("doomed", args, tmp_path)
    try:
        first.wait_healthy()
        ids = [""] * STREAMS
        deltas = [0] * STREAMS
        threads = [
            threading.Thread(target=_read, args=(first.base_url, ids, deltas, i))
            for i in range(STREAMS)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while min(deltas) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.5)  # at least one progress write (every 1 s)
        first.process.kill()
        first.process.wait(10)
        for thread in threads:
            thread.join(10)
    finally:
        first.stop()
    assert all(ids)
    assert min(deltas) >= 5
    assert read_rows(ledger) == []  # open rows only, until a server looks

    second = ServerProcess("restarted", args, tmp_path)
    try:
        second.wait_healthy()
        rows = _rows_once_marked(ledger, STREAMS)
    finally:
        second.stop()
    by_id = {row.request_id: row for row in rows}
    assert sorted(by_id) == sorted(ids)
    for rid, delivered in zip(ids, deltas, strict=True):
        row = by_id[rid]
        assert (row.end_state, row.status) == (EndState.TRUNCATED, 200)
        assert row.first_token_at is not None
        # Counted at the last progress write, over 1 s after each stream had
        # its role chunk and 4 or more content chunks (a token each at least).
        assert row.completion_tokens >= 4, (row, delivered)
    assert main(["usage", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "truncated" in out
    assert str(STREAMS) in out
