"""The PostgreSQL ledger: SQLite's rows and guarantees in a database replicas share.

Every test runs against a real PostgreSQL (``tests/postgres.py``), a database of
its own; the SQLite ledger is the reference the rows are compared with.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.engines.clocks import ManualClock, Timer
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.admission.keys import ApiKey
from sluicegate.server.app.factory import create_app
from sluicegate.server.app.options import config_fields
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger.ledger import (
    OPEN,
    Ledger,
    LedgerRow,
    read_rows,
    usage_totals,
)
from sluicegate.server.ledger.pg import PgLedgerWriter
from sluicegate.server.ledger.pg_read import read_rows as pg_read_rows
from sluicegate.server.ledger.pg_read import usage_totals as pg_usage_totals
from sluicegate.server.ledger.pg_schema import columns, is_url, redact

from ..postgres import PostgresCluster
from .asgi import CHAT, HELLO, Exchange
from .writer_clock import WriterClock

pytestmark = pytest.mark.anyio

_AUTH = [(b"authorization", b"Bearer sk-1")]
_DEAD = "0123456789abcdef0123456789abcdef"


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
        resumed=2 if state is EndState.FINISHED else 0,
    )


def _query(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as db:
        cursor = db.execute(sql.encode(), params)
        return cursor.fetchall() if cursor.description else []


def _states(url: str) -> dict[str, str]:
    return dict(_query(url, "SELECT request_id, end_state FROM requests"))


def test_rows_reach_the_database_in_order_as_they_would_the_file(
    postgres_url: str, tmp_path: Path
) -> None:
    rows = [
        _row("r0", EndState.FINISHED),
        _row("r1", EndState.ABORTED, "k2"),
        replace(_row("r2", EndState.REJECTED), status=400, model=None, ended_at=3.0),
    ]
    database, file = Ledger(url=postgres_url), Ledger(tmp_path / "ledger.sqlite3")
    for ledger in (database, file):
        for row in rows:
            ledger.record(row)
        assert ledger.flush(10)
    assert database.durable
    assert pg_read_rows(postgres_url) == read_rows(tmp_path / "ledger.sqlite3") == rows
    assert pg_usage_totals(postgres_url) == usage_totals(tmp_path / "ledger.sqlite3")
    database.close()
    database.close()
    file.close()
    # A clean close gives the lease back.
    assert _query(postgres_url, "SELECT count(*) FROM ledger_replicas") == [(0,)]


def test_the_table_has_the_sqlite_columns_names_and_types(
    postgres_url: str, tmp_path: Path
) -> None:
    Ledger(url=postgres_url).close()  # the writer made the tables
    sqlite_types = {"TEXT": "text", "INTEGER": "bigint", "REAL": "double precision"}
    Ledger(tmp_path / "ledger.sqlite3").close()
    with sqlite3.connect(tmp_path / "ledger.sqlite3") as db:
        expected = [
            # SQLite lets a TEXT primary key be NULL; PostgreSQL does not.
            (name, sqlite_types[kind], "NO" if not_null or primary else "YES")
            for _, name, kind, not_null, _, primary in db.execute(
                "PRAGMA table_info(requests)"
            )
        ]
    assert (
        _query(
            postgres_url,
            "SELECT column_name, data_type, is_nullable "
            "FROM information_schema.columns WHERE table_name = 'requests' "
            "AND table_schema = current_schema() "
            "ORDER BY ordinal_position",
        )
        == expected
    )
    assert [c[0] for c in columns()] == [name for name, _, _ in expected]
    assert "resumed" in [name for name, _, _ in expected]


def test_a_table_of_an_older_release_gets_the_missing_columns(
    postgres_url: str,
) -> None:
    body = ", ".join(
        f"{name} {kind}" + (" PRIMARY KEY" if name == "request_id" else "")
        for name, kind, _, _ in columns()
        if name not in ("usage_estimated", "resumed", "reasoning_tokens", "server_id")
    )
    _query(postgres_url, f"CREATE TABLE requests ({body})")
    _query(
        postgres_url,
        "INSERT INTO requests VALUES ('old', 'k', '/v1/completions', 'm', 200, "
        "'finished', 1, 2, '[\"stop\"]', 1.0, NULL, 2.0)",
    )
    ledger = Ledger(url=postgres_url)
    ledger.record(_row("new", EndState.FINISHED))
    assert ledger.flush(10)
    ledger.close()
    old, new = pg_read_rows(postgres_url)
    assert (old.request_id, old.usage_estimated, old.resumed) == ("old", False, 0)
    assert old.reasoning_tokens == 0
    assert new == _row("new", EndState.FINISHED)


async def _three_requests(app: Any) -> list[Exchange]:
    """A finished stream, a rejected body, and a stream the client leaves."""
    short = {"messages": HELLO, "stream": True, "max_tokens": 5}
    finished = Exchange(app, CHAT, short, extra_headers=_AUTH)
    rejected = Exchange(app, CHAT, {"messages": HELLO, "n": 0}, extra_headers=_AUTH)
    with anyio.fail_after(10):
        await finished.run()
        await rejected.run()
    long = {"messages": HELLO, "stream": True, "max_tokens": 1000}
    left = Exchange(app, CHAT, long, extra_headers=_AUTH)
    async with anyio.create_task_group() as tg:
        tg.start_soon(left.run)
        with anyio.fail_after(10):
            await left.wait_for(left.has_content)
        left.leave()
    return [finished, rejected, left]


def _comparable(row: LedgerRow) -> tuple[Any, ...]:
    """A row's fields that two runs of the same requests share."""
    return (
        row.endpoint,
        row.model,
        row.status,
        row.end_state,
        row.prompt_tokens,
        row.finish_reasons,
        row.key_id,
        row.usage_estimated,
        row.resumed,
        row.first_token_at is None,
        row.completion_tokens > 0,
    )


async def test_finished_rejected_and_aborted_requests_land_as_in_sqlite(
    postgres_url: str, tmp_path: Path
) -> None:
    keys = (ApiKey("sk-1", key_id="alice"),)
    landed: list[list[LedgerRow]] = []
    for target in ({"ledger_url": postgres_url}, {"ledger_path": tmp_path / "l.db"}):
        config = ServerConfig(api_keys=keys, **target)
        app = create_app(ScriptedEngine("word " * 1000, tokens_per_s=2000), config)
        ledger: Ledger = app.state.ledger
        exchanges = await _three_requests(app)
        assert [ex.status for ex in exchanges] == [200, 400, 200]
        assert await ledger.aflush(10)
        await ledger.aclose()
        rows = (
            pg_read_rows(postgres_url) if ledger.url else read_rows(tmp_path / "l.db")
        )
        assert len({r.request_id for r in rows}) == 3
        streamed = {ex.payloads()[0]["id"] for ex in exchanges[::2]}
        assert streamed <= {r.request_id for r in rows}
        landed.append(sorted(rows, key=lambda r: r.end_state))
    database, file = landed
    assert [r.end_state for r in database] == [
        EndState.ABORTED,
        EndState.FINISHED,
        EndState.REJECTED,
    ]
    assert [_comparable(r) for r in database] == [_comparable(r) for r in file]


async def test_an_open_row_gets_its_token_counts_until_it_ends(
    postgres_url: str,
) -> None:
    clock = ManualClock()
    ledger = Ledger(url=postgres_url, progress_interval_s=0.01, clock=clock)
    delivered = [0]
    ledger.open(_row("r0", EndState.FINISHED), lambda: (delivered[0], 7.0))
    delivered[0] = 42
    clock.advance(0.01)  # one progress write
    assert await ledger.aflush(10)
    assert _query(
        postgres_url,
        "SELECT end_state, completion_tokens, first_token_at FROM requests",
    ) == [(OPEN, 42, 7.0)]
    (total,) = pg_usage_totals(postgres_url)
    assert (total.end_state, total.requests) == (OPEN, 1)
    assert pg_read_rows(postgres_url) == []  # ended rows only
    ledger.record(_row("r0", EndState.FINISHED))
    await ledger.aclose()
    assert _states(postgres_url) == {"r0": "finished"}


class _ArmedClock(ManualClock):
    """A ``ManualClock`` that says when the writer thread set a timer on it."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()

    def call_at(self, when: float, callback: Callable[[], object]) -> Timer:
        if threading.current_thread() is not threading.main_thread():
            self.armed.set()
        return super().call_at(when, callback)


def _leave_dead_server(url: str, request_id: str, server_id: str) -> None:
    """What a replica killed mid-stream leaves: its open row, an expired lease."""
    _query(
        url,
        "INSERT INTO requests SELECT %s, key_id, endpoint, model, 200, "
        "'open', 4, 17, finish_reasons, received_at, 1.5, 3.0, 0, 0, 0, %s "
        "FROM requests WHERE request_id = 'alive-0'",
        (request_id, server_id),
    )
    _query(url, "INSERT INTO ledger_replicas VALUES (%s, 0, 1)", (server_id,))


async def test_a_replica_marks_the_open_rows_of_servers_whose_lease_expired(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    living = Ledger(url=postgres_url, lease_s=30)
    living.open(_row("alive-0", EndState.FINISHED), lambda: (9, 1.5))
    assert await living.aflush(10)
    _leave_dead_server(postgres_url, "dead-0", _DEAD)
    clock = _ArmedClock()
    writer = PgLedgerWriter(
        postgres_url, lease_s=30, heartbeat_interval_s=5, timers=clock
    )
    with caplog.at_level(logging.WARNING):
        assert writer.flush(10)  # its first heartbeat, when it connects
    assert _states(postgres_url) == {"alive-0": OPEN, "dead-0": "truncated"}
    (dead,) = pg_read_rows(postgres_url)
    assert (dead.status, dead.completion_tokens, dead.ended_at) == (200, 17, 3.0)
    assert any("1 requests of servers whose lease" in m for m in caplog.messages)
    assert _query(postgres_url, "SELECT count(*) FROM ledger_replicas") == [(2,)]
    # A server that dies later is marked at the next heartbeat, on the clock,
    # with no row to write: the heartbeat's timer wakes the thread.
    _leave_dead_server(postgres_url, "dead-1", "f" * 32)
    assert clock.armed.wait(10)
    clock.armed.clear()
    clock.advance(4.9)
    assert writer.flush(10)
    assert _states(postgres_url)["dead-1"] == OPEN
    clock.advance(0.1)
    assert clock.armed.wait(10)  # it beat, then set the next beat's timer
    assert _states(postgres_url)["dead-1"] == "truncated"
    living.record(_row("alive-0", EndState.FINISHED))
    await living.aclose()
    writer.close()
    writer.close()  # a second close does nothing
    assert _states(postgres_url) == {
        "alive-0": "finished",
        "dead-0": "truncated",
        "dead-1": "truncated",
    }


async def test_a_database_that_goes_away_is_behind_then_catches_up(
    postgres: PostgresCluster, postgres_url: str
) -> None:
    config = ServerConfig(ledger_url=postgres_url)
    app = create_app(ScriptedEngine(tokens_per_s=5000), config)
    ledger: Ledger = app.state.ledger
    ledger._max_backlog = 2  # an open and an end row
    body = {"messages": HELLO, "stream": True}
    ok = Exchange(app, CHAT, body)
    with anyio.fail_after(10):
        await ok.run()
    assert await ledger.aflush(10)
    postgres.stop()
    written = Exchange(app, CHAT, body)
    with anyio.fail_after(10):
        await written.run()  # answered while the database is away
    behind = ledger.behind  # (a name: mypy would take the property as fixed)
    assert behind
    refused = Exchange(app, CHAT, body)
    with anyio.fail_after(10):
        await refused.run()
    assert refused.status == 503
    assert json.loads(refused.body)["error"]["code"] == "ledger_behind"
    postgres.start()
    assert await ledger.aflush(30)
    assert not ledger.behind
    again = Exchange(app, CHAT, body)
    with anyio.fail_after(10):
        await again.run()
    assert again.status == 200
    assert await ledger.aflush(10)
    await ledger.aclose()
    rows = pg_read_rows(postgres_url)  # the refusal has its row too
    assert [(r.end_state, r.status) for r in rows] == [
        (EndState.FINISHED, 200),
        (EndState.FINISHED, 200),
        (EndState.REJECTED, 503),
        (EndState.FINISHED, 200),
    ]
    ids = [ex.payloads()[0]["id"] for ex in (ok, written, again)]
    assert [rows[i].request_id for i in (0, 1, 3)] == ids


def test_rows_put_while_the_database_is_away_land_in_order_once_it_is_back(
    postgres: PostgresCluster, postgres_url: str
) -> None:
    ledger = Ledger(url=postgres_url)
    assert ledger.flush(10)
    postgres.stop()
    rows = [_row(f"r{i:04}", EndState.FINISHED) for i in range(2500)]  # > a batch
    for row in rows:
        ledger.record(row)
    assert not ledger.flush(0.2)
    assert ledger.backlog >= len(rows)  # (and the flush marker)
    postgres.start()
    assert ledger.flush(30)
    ledger.close()
    ids = _query(postgres_url, "SELECT request_id FROM requests ORDER BY request_id")
    assert [rid for (rid,) in ids] == [r.request_id for r in rows]


def test_close_gives_up_on_an_absent_database_and_logs_each_row(
    postgres: PostgresCluster, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger(url=postgres_url, close_timeout_s=5.0)
    clock = WriterClock(ledger)
    assert ledger.flush(10)
    postgres.stop()
    with caplog.at_level(logging.ERROR):
        ledger.record(_row("r-kept-in-the-log", EndState.ABORTED))
        clock.settle()  # refused: a retry waits on the clock
        clock.close()
        clock.advance(4.9)
        clock.settle()
        assert not clock.closed.is_set()
        clock.step_until_closed(0.1)  # at 5 s it gives up
    postgres.start()
    assert pg_read_rows(postgres_url) == []
    assert any("not written" in m and "r-kept-in-the-log" in m for m in caplog.messages)
    assert any("1 statements logged above instead" in m for m in caplog.messages)


def test_a_row_postgres_refuses_is_logged_alone_and_the_others_are_written(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ledger = Ledger(url=postgres_url)
    ledger.record(_row("r1", EndState.FINISHED))
    writer = ledger._writer
    assert isinstance(writer, PgLedgerWriter)
    with caplog.at_level(logging.ERROR):
        # A statement that breaks a NOT NULL constraint: a bug, never retried.
        writer.put("INSERT INTO requests (request_id) VALUES (?)", ("bad",))
        ledger.record(_row("r2", EndState.FINISHED))
        assert ledger.flush(10)
    assert [r.request_id for r in pg_read_rows(postgres_url)] == ["r1", "r2"]
    assert any("cannot be written" in m for m in caplog.messages)
    assert ledger.write_errors == 1
    ledger.close()


def test_usage_prints_the_same_totals_over_a_url_as_over_a_file(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.sqlite3"
    for ledger in (Ledger(url=postgres_url), Ledger(path)):
        ledger.record(_row("r1", EndState.ERRORED, "bob"))
        ledger.record(_row("r2", EndState.TRUNCATED, "bob"))
        ledger.record(_row("r3", EndState.FINISHED, "alice"))
        ledger.close()
    tables = []
    for target in (postgres_url, str(path)):
        assert main(["usage", "--ledger", target]) == 0
        out = capsys.readouterr().out  # the title (it may wrap) names the target
        tables.append([line for line in out.splitlines() if line[:1] in "┏┃┡│└"])
    assert tables[0] == tables[1]
    assert any("truncated" in line for line in tables[0])


def test_usage_over_an_unreachable_database_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from sluicegate.testing import free_port

    url = f"postgresql://u:secret@127.0.0.1:{free_port()}/db?connect_timeout=2"
    assert main(["usage", "--ledger", url]) == 2
    err = capsys.readouterr().err
    assert "cannot read the ledger" in err
    assert "secret" not in err


def test_urls_are_told_from_paths_and_their_passwords_hidden() -> None:
    assert is_url("postgresql://h/db")
    assert is_url("postgres://h/db")
    assert not is_url("/var/lib/ledger.sqlite3")
    assert redact("postgresql://u:pw@h:5/db?x=1") == "postgresql://u:***@h:5/db?x=1"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(ValueError, match="expected a PostgreSQL URL"):
        PgLedgerWriter("postgresql://u:pw@h/db?no_such_option=1")
    with pytest.raises(ValueError, match="lease_s must be > 0"):
        PgLedgerWriter("postgresql://h/db", lease_s=0)
    with pytest.raises(ValueError, match="a path or a URL"):
        Ledger(Path("x.db"), url="postgresql://h/db")


def test_serve_options_take_a_url_or_a_path(tmp_path: Path) -> None:
    import argparse

    from sluicegate.server.app.options import add_serve_options

    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    add_serve_options(parser)
    url = "postgresql://h/db"
    fields = config_fields(
        parser.parse_args(["--ledger", url, "--ledger-lease-s", "3"])
    )
    assert (fields["ledger_url"], fields["ledger_path"]) == (url, None)
    assert fields["ledger_lease_s"] == 3.0
    path = str(tmp_path / "l.db")
    fields = config_fields(parser.parse_args(["--ledger", path]))
    assert (fields["ledger_url"], fields["ledger_path"]) == (None, Path(path))
    fields = config_fields(parser.parse_args(["--no-ledger"]))
    assert (fields["ledger_url"], fields["ledger_path"]) == (None, None)
