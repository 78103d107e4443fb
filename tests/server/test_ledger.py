"""The SQLite ledger: one row per request, written off the loop, never dropped."""

from __future__ import annotations

import dataclasses
import logging
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.file import SCHEMA_VERSION
from sluicegate.server.ledger.ledger import (
    OPEN,
    Ledger,
    LedgerRow,
    read_rows,
    usage_totals,
)
from sluicegate.server.ledger.locks import servers_dir
from sluicegate.server.ledger.writer import LedgerWriter

from .asgi import CHAT, HELLO, Exchange, exchange
from .writer_clock import WriterClock

pytestmark = pytest.mark.anyio

# The ledger file of the first release, as it was created.
_FIRST_SCHEMA = """
CREATE TABLE requests (
    request_id TEXT PRIMARY KEY,
    key_id TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    model TEXT,
    status INTEGER NOT NULL,
    end_state TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reasons TEXT NOT NULL,
    received_at REAL NOT NULL,
    first_token_at REAL,
    ended_at REAL NOT NULL
)
"""


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


@contextmanager
def _locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection holds ``BEGIN EXCLUSIVE`` on ``path`` until the end."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        yield holder
        holder.execute("ROLLBACK")
    finally:
        holder.close()


def _states(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        query = "SELECT request_id, end_state FROM requests ORDER BY rowid"
        return [(str(rid), str(state)) for rid, state in db.execute(query)]


def test_rows_reach_the_file_in_order_once_flushed(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite3"
    ledger = Ledger(path)
    for i in range(3):
        ledger.record(_row(f"r{i}", EndState.FINISHED))
    assert ledger.flush(5)
    # Another connection (as after a kill -9) sees the rows.
    with sqlite3.connect(path) as other:
        assert other.execute("SELECT request_id FROM requests").fetchall() == [
            ("r0",),
            ("r1",),
            ("r2",),
        ]
        assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert read_rows(path) == [_row(f"r{i}", EndState.FINISHED) for i in range(3)]
    assert ledger.backlog == 0
    ledger.close()
    ledger.close()
    ledger.record(_row("r3", EndState.FINISHED))  # after close: memory only
    assert ledger.flush()
    assert [r.request_id for r in ledger.rows] == ["r0", "r1", "r2", "r3"]
    assert len(read_rows(path)) == 3
    assert list(servers_dir(path).iterdir()) == []  # its lock file is gone


def test_a_file_that_is_not_sqlite_is_refused_at_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    path.write_bytes(b"not a database, certainly not one" * 100)
    with pytest.raises(sqlite3.DatabaseError):
        Ledger(path)


def test_usage_totals_group_by_key_and_end_state(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    for i, (state, key) in enumerate(
        [(EndState.FINISHED, "k1"), (EndState.FINISHED, "k1"), (EndState.ABORTED, "k2")]
    ):
        row = dataclasses.replace(_row(f"r{i}", state, key), reasoning_tokens=i)
        ledger.record(row)
    ledger.close()
    totals = [
        (
            t.key_id,
            t.end_state,
            t.requests,
            t.prompt_tokens,
            t.completion_tokens,
            t.reasoning_tokens,
        )
        for t in usage_totals(path)
    ]
    assert totals == [
        ("k1", EndState.FINISHED, 2, 6, 10, 1),
        ("k2", EndState.ABORTED, 1, 3, 5, 2),
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
    bad = Exchange(app, CHAT, {"messages": HELLO, "n": 0}, extra_headers=auth)
    with anyio.fail_after(5):
        await bad.run()  # 400
    await exchange(app, CHAT, {"messages": HELLO, "stream": True})  # 401: no row
    ledger: Ledger = app.state.ledger
    assert await ledger.aflush(5)
    rows = read_rows(path)
    assert [(r.key_id, r.end_state, r.status) for r in rows] == [
        ("alice", EndState.FINISHED, 200),
        ("alice", EndState.REJECTED, 400),
    ]
    assert rows[0].first_token_at is not None
    assert rows[0].completion_tokens > 0
    assert rows[0].finish_reasons == (FinishReason.STOP,)
    await ledger.aclose()


async def test_a_locked_ledger_neither_stalls_the_loop_nor_loses_rows(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    app = create_app(ScriptedEngine(tokens_per_s=5000), ServerConfig(ledger_path=path))
    ledger: Ledger = app.state.ledger
    assert await ledger.aflush(5)  # the writer made the table

    async def three_streams(exchanges: list[Exchange]) -> float:
        """Run three streams; how late the loop ran a 10 ms sleep meanwhile."""
        lag_s = 0.0

        async def tick() -> None:
            nonlocal lag_s
            while True:
                before = time.monotonic()
                await anyio.sleep(0.01)
                lag_s = max(lag_s, time.monotonic() - before - 0.01)

        async with anyio.create_task_group() as tg:
            tg.start_soon(tick)
            for _ in range(3):
                # Each answered well within SQLite's old 5 s wait per row.
                with anyio.fail_after(2):
                    exchanges.append(
                        await exchange(app, CHAT, {"messages": HELLO, "stream": True})
                    )
            tg.cancel_scope.cancel()
        return lag_s

    unlocked: list[Exchange] = []
    baseline_s = await three_streams(unlocked)  # the same work, no lock
    assert await ledger.aflush(5)
    exchanges: list[Exchange] = []
    with _locked(path):  # a backup, or a sqlite3 shell in BEGIN EXCLUSIVE
        lag_s = await three_streams(exchanges)
        assert all(ex.completed for ex in exchanges + unlocked)
        # The old code blocked the loop up to 5 s per row here.
        assert lag_s < max(4 * baseline_s, baseline_s + 1.0)
        assert not await ledger.aflush(0.3)  # still waiting for the lock
        assert ledger.backlog >= 3
    # The lock is gone: every row, in order, none lost.
    assert await ledger.aflush(10)
    ids = [ex.payloads()[0]["id"] for ex in unlocked + exchanges]
    assert [(r.request_id, r.end_state) for r in read_rows(path)] == [
        (rid, EndState.FINISHED) for rid in ids
    ]
    await ledger.aclose()


def test_close_waits_for_the_lock_and_commits_what_was_queued(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    clock = WriterClock(ledger)
    assert ledger.flush(5)
    with _locked(path) as holder:
        for i in range(3):
            ledger.record(_row(f"r{i}", EndState.FINISHED))
        clock.settle()  # the lock refused the rows: a retry waits
        clock.close()
        clock.advance(1.0)
        clock.settle()  # retried, refused again: close waits on
        assert not clock.closed.is_set()
        holder.execute("ROLLBACK")
        clock.step_until_closed(1.0)  # the next retry finds the file free
        holder.execute("BEGIN")  # for _locked's own ROLLBACK
    assert [r.request_id for r in read_rows(path)] == ["r0", "r1", "r2"]


def test_close_gives_up_on_a_lock_that_outlasts_it_and_logs_each_row(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path, close_timeout_s=5.0)
    clock = WriterClock(ledger)
    assert ledger.flush(5)
    with _locked(path), caplog.at_level(logging.ERROR):
        ledger.record(_row("r-kept-in-the-log", EndState.ABORTED))
        clock.settle()
        clock.close()  # its limit: 5 s from now on the clock
        clock.advance(4.9)
        clock.settle()
        assert not clock.closed.is_set()
        clock.step_until_closed(0.1)  # at 5 s it gives up
        assert clock.time() <= 5.1
    assert read_rows(path) == []
    lines = [r.getMessage() for r in caplog.records]
    assert any("not written" in m and "r-kept-in-the-log" in m for m in lines)
    assert any("1 statements logged above instead" in m for m in lines)


def test_a_row_sqlite_refuses_is_logged_alone_and_the_others_are_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.record(_row("r1", EndState.FINISHED))
    writer = ledger._writer
    assert isinstance(writer, LedgerWriter)
    with caplog.at_level(logging.ERROR):
        # A statement that breaks a NOT NULL constraint: a bug, never retried.
        writer.put("INSERT INTO requests (request_id) VALUES (?)", ("bad",))
        ledger.record(_row("r2", EndState.FINISHED))
        assert ledger.flush(5)
    assert [r.request_id for r in read_rows(path)] == ["r1", "r2"]
    assert any("cannot be written" in r.getMessage() for r in caplog.records)
    assert ledger.write_errors == 1
    ledger.close()


async def test_an_admitted_request_has_an_open_row_until_it_ends(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    engine = ScriptedEngine(never_finishes=True, tokens_per_s=200)
    app = create_app(engine, ServerConfig(ledger_path=path))
    ledger: Ledger = app.state.ledger
    ex = Exchange(app, CHAT, {"messages": HELLO, "stream": True})
    async with anyio.create_task_group() as tg:
        tg.start_soon(ex.run)
        await ex.wait_for(ex.has_content)
        assert await ledger.aflush(5)
        rid = ex.payloads()[0]["id"]
        assert _states(path) == [(rid, OPEN)]
        assert read_rows(path) == []  # ended rows only
        (total,) = usage_totals(path)
        assert (total.end_state, total.requests) == (OPEN, 1)
        ex.leave()
    assert await ledger.aflush(5)
    assert _states(path) == [(rid, str(EndState.ABORTED))]
    (row,) = read_rows(path)
    assert row.completion_tokens > 0
    await ledger.aclose()


async def test_open_rows_get_their_token_counts_as_they_grow(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    clock = ManualClock()
    ledger = Ledger(path, progress_interval_s=0.01, clock=clock)
    delivered = [0, 0]  # per request

    def counts(i: int) -> tuple[int, float | None]:
        return delivered[i], 7.0 if delivered[i] else None

    ledger.open(_row("r0", EndState.FINISHED), lambda: counts(0))
    ledger.open(_row("r1", EndState.FINISHED), lambda: counts(1))
    delivered[0] = 42
    clock.advance(0.01)  # one progress write
    assert await ledger.aflush(5)
    with sqlite3.connect(path) as db:
        query = "SELECT request_id, completion_tokens, first_token_at FROM requests"
        assert sorted(db.execute(query)) == [("r0", 42, 7.0), ("r1", 0, None)]
    ledger.record(_row("r0", EndState.FINISHED))
    await ledger.aclose()
    assert _states(path) == [("r0", "finished"), ("r1", OPEN)]


async def test_rows_left_open_by_a_dead_server_are_marked_truncated(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.sqlite3"
    living = Ledger(path)
    living.open(_row("alive-0", EndState.FINISHED), lambda: (9, 1.5))
    assert await living.aflush(5)
    with sqlite3.connect(path) as db:  # what a server killed mid-stream left
        db.execute(
            "INSERT INTO requests SELECT 'dead-0', key_id, endpoint, model, 200, "
            "'open', 4, 17, finish_reasons, received_at, 1.5, 3.0, 0, 0, 0, ? "
            "FROM requests",
            ("0123456789abcdef0123456789abcdef",),
        )
    servers_dir(path).joinpath("fedcba9876543210.lock").touch()  # a stale lock
    restarted = Ledger(path)
    assert await restarted.aflush(5)
    assert dict(_states(path)) == {"alive-0": OPEN, "dead-0": "truncated"}
    (dead,) = read_rows(path)
    assert (dead.request_id, dead.status, dead.completion_tokens) == ("dead-0", 200, 17)
    assert dead.ended_at == 3.0  # when it was last known alive
    assert dead.first_token_at == 1.5
    locks = sorted(p.stem for p in servers_dir(path).glob("*.lock"))
    assert "fedcba9876543210" not in locks
    assert len(locks) == 2  # the two running servers
    living.record(_row("alive-0", EndState.FINISHED))
    await living.aclose()
    await restarted.aclose()
    assert dict(_states(path)) == {"alive-0": "finished", "dead-0": "truncated"}


def test_a_ledger_file_of_the_first_release_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute(_FIRST_SCHEMA)
        db.execute(
            "INSERT INTO requests VALUES "
            "('old-1', 'bob', '/v1/completions', 'm', 200, 'finished', 2, 3, "
            "'[\"length\"]', 1.0, 1.5, 2.0)"
        )
    assert [r.request_id for r in read_rows(path)] == ["old-1"]  # read as it is
    ledger = Ledger(path)
    ledger.record(_row("new-1", EndState.FINISHED))
    ledger.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (SCHEMA_VERSION,)
        columns = [c[1] for c in db.execute("PRAGMA table_info(requests)")]
        assert columns[-4:] == [
            "server_id",
            "usage_estimated",
            "resumed",
            "reasoning_tokens",
        ]
    old, new = read_rows(path)
    assert (old.request_id, old.key_id, old.finish_reasons) == (
        "old-1",
        "bob",
        (FinishReason.LENGTH,),
    )
    assert new == _row("new-1", EndState.FINISHED)
    Ledger(path).close()  # a current file is left as it is


def test_a_ledger_file_without_the_resumed_column_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(_FIRST_SCHEMA)
        db.execute("ALTER TABLE requests ADD COLUMN server_id TEXT")
        db.execute(
            "ALTER TABLE requests ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0"
        )
        db.execute("PRAGMA user_version = 3")
        db.execute(
            "INSERT INTO requests VALUES ('old-1', 'bob', '/v1/completions', 'm', "
            "200, 'finished', 2, 3, '[\"length\"]', 1.0, 1.5, 2.0, NULL, 0)"
        )
    assert read_rows(path)[0].resumed == 0  # read before any migration
    ledger = Ledger(path)
    resumed = dataclasses.replace(_row("new-1", EndState.ABORTED), resumed=2)
    ledger.record(resumed)
    ledger.close()
    old, new = read_rows(path)
    assert (old.request_id, old.resumed) == ("old-1", 0)
    assert new == resumed


def test_a_ledger_file_without_the_reasoning_column_gets_it(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(_FIRST_SCHEMA)
        db.execute("ALTER TABLE requests ADD COLUMN server_id TEXT")
        for name in ("usage_estimated", "resumed"):
            db.execute(
                f"ALTER TABLE requests ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0"
            )
        db.execute("PRAGMA user_version = 4")
        db.execute(
            "INSERT INTO requests VALUES ('old-1', 'bob', '/v1/completions', 'm', "
            "200, 'finished', 2, 3, '[\"length\"]', 1.0, 1.5, 2.0, NULL, 0, 0)"
        )
    assert read_rows(path)[0].reasoning_tokens == 0  # read before any migration
    ledger = Ledger(path)
    thought = dataclasses.replace(_row("new-1", EndState.FINISHED), reasoning_tokens=2)
    ledger.record(thought)
    ledger.close()
    old, new = read_rows(path)
    assert (old.request_id, old.reasoning_tokens) == ("old-1", 0)
    assert new == thought


def test_usage_command_prints_totals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path)
    ledger.record(_row("r1", EndState.ERRORED, "bob"))
    thought = _row("r2", EndState.TRUNCATED, "bob")
    ledger.record(dataclasses.replace(thought, reasoning_tokens=4))
    ledger.close()
    assert main(["usage", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "reasoning" in out
    # The truncated row: 1 request, 3 prompt, 5 completion, 4 of them reasoning.
    line = next(line for line in out.splitlines() if "truncated" in line)
    assert re.findall(r"\d+", line) == ["1", "3", "5", "4"]
    assert "bob" in out
    assert "errored" in out
    assert "truncated" in out
    assert main(["usage", "--ledger", str(tmp_path / "missing")]) == 2
