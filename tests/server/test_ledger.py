"""The SQLite ledger: one committed row per request, totals per key and state."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.engines.scripted import ScriptedEngine
from sluicegate.server.admission import ApiKey
from sluicegate.server.app import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger import Ledger, LedgerRow, read_rows, usage_totals

from .asgi import CHAT, HELLO, Exchange, exchange

pytestmark = pytest.mark.anyio


def _row(request_id: str, state: EndState, key_id: str = "k1") -> LedgerRow:
    return LedgerRow(
        request_id=request_id,
        endpoint=CHAT,
        model="m",
        status=200,
        end_state=state,
        prompt_tokens=3,
        completion_tokens=5,
        finish_reasons=(FinishReason.STOP, None),
        received_at=1.0,
        first_token_at=None,
        ended_at=2.0,
        key_id=key_id,
    )


def test_rows_are_committed_before_record_returns(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.record(_row("r1", EndState.FINISHED))
    # Another connection (as after a kill -9) sees the row at once.
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT request_id FROM requests").fetchall() == [("r1",)]
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert read_rows(path) == [_row("r1", EndState.FINISHED)]
    ledger.close()
    ledger.close()


def test_usage_totals_group_by_key_and_end_state(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    for i, (state, key) in enumerate(
        [(EndState.FINISHED, "k1"), (EndState.FINISHED, "k1"), (EndState.ABORTED, "k2")]
    ):
        ledger.record(_row(f"r{i}", state, key))
    ledger.close()
    totals = [
        (t.key_id, t.end_state, t.requests, t.prompt_tokens, t.completion_tokens)
        for t in usage_totals(path)
    ]
    assert totals == [
        ("k1", EndState.FINISHED, 2, 6, 10),
        ("k2", EndState.ABORTED, 1, 3, 5),
    ]


async def test_every_request_gets_one_row_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    config = ServerConfig(api_keys=(ApiKey("sk-1", key_id="alice"),), ledger_path=path)
    engine = ScriptedEngine(tokens_per_s=5000)
    app = create_app(engine, config)
    auth = [(b"authorization", b"Bearer sk-1")]
    ok = Exchange(app, CHAT, {"messages": HELLO, "stream": True}, extra_headers=auth)
    with anyio.fail_after(5):
        await ok.run()
    await exchange(app, CHAT, {"messages": HELLO, "stream": True})  # 401
    rows = read_rows(path)
    assert [(r.key_id, r.end_state, r.status) for r in rows] == [
        ("alice", EndState.FINISHED, 200),
        ("anonymous", EndState.REJECTED, 401),
    ]
    assert rows[0].first_token_at is not None
    assert rows[0].completion_tokens > 0
    assert rows[0].finish_reasons == (FinishReason.STOP,)


def test_usage_command_prints_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.record(_row("r1", EndState.ERRORED, "bob"))
    ledger.close()
    assert main(["usage", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "bob" in out
    assert "errored" in out
    assert main(["usage", "--ledger", str(tmp_path / "missing")]) == 2
