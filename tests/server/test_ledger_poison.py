"""Ledger rows no database can store: repaired, or dropped alone; the writer lives.

Each test runs against both ledgers: an SQLite file, and a real PostgreSQL
(``tests/postgres.py``). A poisoned statement goes to the writer between good
ones; the good ones land, the poisoned one is logged and counted, and the writer's
thread keeps writing. A row with values out of range goes through ``Ledger`` and
is written repaired.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from starlette.applications import Starlette

from sluicegate.cli import main
from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.ledger import ledger as ledger_module
from sluicegate.server.ledger.ledger import (
    OPEN,
    Ledger,
    LedgerRow,
    UsageTotal,
    read_rows,
    usage_totals,
)
from sluicegate.server.ledger.pg import PgLedgerWriter
from sluicegate.server.ledger.pg_read import read_rows as pg_read_rows
from sluicegate.server.ledger.pg_read import usage_totals as pg_usage_totals
from sluicegate.server.ledger.values import MAX_COUNT, MAX_TEXT_CHARS
from sluicegate.server.ledger.writer import LedgerWriter

from .asgi import CHAT, HELLO

pytestmark = pytest.mark.anyio

_SERVER = "0123456789abcdef0123456789abcdef"


def _row(request_id: str, **changes: object) -> LedgerRow:
    row = LedgerRow(
        request_id=request_id,
        endpoint=CHAT,
        model="m",
        status=200,
        end_state=EndState.FINISHED,
        prompt_tokens=3,
        completion_tokens=5,
        finish_reasons=(FinishReason.STOP,),
        received_at=1.0,
        first_token_at=1.5,
        ended_at=2.0,
        key_id="k1",
    )
    return dataclasses.replace(row, **changes)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledger]:
    """A ledger on each backend, closed at the end."""
    if request.param == "sqlite":
        made = Ledger(tmp_path / "ledger.sqlite3")
    else:
        made = Ledger(url=request.getfixturevalue("postgres_url"))
    yield made
    made.close()


def _read(ledger: Ledger) -> list[LedgerRow]:
    if ledger.url is not None:
        return pg_read_rows(ledger.url)
    assert ledger.path is not None
    return read_rows(ledger.path)


def _poisons(ledger: Ledger) -> list[tuple[object, ...]]:
    """Close statements' values that the backend cannot take, each for a reason
    of its own (``Ledger`` would have repaired them: they go to the writer as
    they are)."""

    def values(request_id: str, **changes: object) -> tuple[object, ...]:
        return ledger_module._values(_row(request_id, **changes), "finished", _SERVER)

    poisons = [
        values("past-64-bits", completion_tokens=2**64),  # sqlite: OverflowError
        values("int-of-5000-digits", prompt_tokens=10**5000),
        values("lone-surrogate", key_id="k\ud800"),  # UnicodeEncodeError
        (*values("unbindable")[:-1], {"a": "dict"}),  # no adapter for a dict
    ]
    if ledger.url is None:  # NaN is NULL to SQLite: a NOT NULL column refuses it
        poisons.append(values("nan", received_at=math.nan))
    else:  # PostgreSQL's text refuses NUL
        poisons.append(values("nul", model="m\x00"))
    return poisons


def test_a_poisoned_row_between_good_ones_is_dropped_alone_and_the_writer_lives(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    writer = ledger._writer
    assert isinstance(writer, LedgerWriter | PgLedgerWriter)
    poisons = _poisons(ledger)
    with caplog.at_level(logging.ERROR):
        for i, poison in enumerate(poisons):
            ledger.record(_row(f"good-{i}"))
            writer.put(ledger_module._CLOSE_SQL, poison)
        ledger.record(_row("good-last"))
        assert ledger.flush(30)
    landed = [row.request_id for row in _read(ledger)]
    assert landed == [f"good-{i}" for i in range(len(poisons))] + ["good-last"]
    assert ledger.write_errors == len(poisons)
    assert writer._thread.is_alive()
    dropped = [m for m in caplog.messages if "cannot be written" in m]
    assert len(dropped) == len(poisons)
    assert all(len(m) < 4 * MAX_TEXT_CHARS for m in dropped)  # never the whole value
    # Later rows still go through the same thread.
    ledger.record(_row("after"))
    assert ledger.flush(30)
    assert _read(ledger)[-1].request_id == "after"


def test_a_whole_batch_with_one_poisoned_row_keeps_every_other_row(
    ledger: Ledger,
) -> None:
    writer = ledger._writer
    assert isinstance(writer, LedgerWriter | PgLedgerWriter)
    poison = _poisons(ledger)[0]
    rows = [_row(f"r{i:03}", ended_at=2.0 + i) for i in range(200)]
    for i, row in enumerate(rows):  # put faster than written: batches of many
        ledger.record(row)
        if i == 137:
            writer.put(ledger_module._CLOSE_SQL, poison)
    assert ledger.flush(30)
    assert [r.request_id for r in _read(ledger)] == [r.request_id for r in rows]
    assert ledger.write_errors == 1


def test_values_out_of_range_are_written_repaired_and_marked_estimated(
    ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    odd = _row(
        "odd",
        prompt_tokens=9_000_000_000_000_000_000 * 2,  # past 64 bits
        completion_tokens=-7,
        status=10**5000,
        resumed=math.nan,
        received_at=math.inf,
        first_token_at=math.nan,
        ended_at=10**400,
        model="m\x00\ud800" + "x" * (2 * MAX_TEXT_CHARS),
        key_id="k\ud83d",
    )
    with caplog.at_level(logging.WARNING):
        kept = ledger.record(odd)
        ledger.record(_row("fine"))
        assert ledger.flush(30)
    assert ledger.repaired_rows == 1
    assert ledger.write_errors == 0
    assert kept.prompt_tokens == MAX_COUNT
    assert kept.completion_tokens == 0
    assert (kept.status, kept.resumed) == (MAX_COUNT, 0)
    assert kept.usage_estimated
    assert kept.first_token_at is None
    assert math.isfinite(kept.received_at)
    assert math.isfinite(kept.ended_at)
    assert kept.model == "m\ufffd\ufffd" + "x" * (MAX_TEXT_CHARS - 3)
    assert kept.key_id == "k\ufffd"
    written = {row.request_id: row for row in _read(ledger)}
    assert written == {"odd": kept, "fine": _row("fine")}
    assert ledger.rows == [kept, _row("fine")]
    (warning,) = [m for m in caplog.messages if "no ledger can store" in m]
    assert "prompt_tokens 18000000000000000000 written as" in warning
    assert "status <an integer of 16610 bits>" in warning


async def test_an_open_row_with_impossible_counts_is_closed_by_its_end(
    ledger: Ledger,
) -> None:
    """The open row, its progress and its end are written repaired alike: the
    end replaces the open row, which never stays open."""
    clock = ManualClock()
    ledger._clock = clock
    ledger.open(_row("r", completion_tokens=2**70), lambda: (2**80, math.nan))
    clock.advance(3.0)  # three progress writes, one a second
    assert await ledger.aflush(30)
    ledger.record(_row("r", completion_tokens=2**70))
    assert await ledger.aflush(30)
    (row,) = _read(ledger)
    assert (row.end_state, row.completion_tokens) == (EndState.FINISHED, MAX_COUNT)
    assert [t.end_state for t in _totals(ledger)] == [EndState.FINISHED]
    assert ledger.write_errors == 0


def _totals(ledger: Ledger) -> list[UsageTotal]:
    if ledger.url is not None:
        return pg_usage_totals(ledger.url)
    assert ledger.path is not None
    return usage_totals(ledger.path)


async def test_metrics_count_rows_dropped_and_rows_repaired(tmp_path: Path) -> None:
    app: Starlette = create_app(
        ScriptedEngine(), ServerConfig(ledger_path=tmp_path / "ledger.sqlite3")
    )
    async with app.router.lifespan_context(app):
        ledger: Ledger = app.state.ledger
        writer = ledger._writer
        assert isinstance(writer, LedgerWriter)
        writer.put(ledger_module._CLOSE_SQL, _poisons(ledger)[0])
        ledger.record(_row("odd", completion_tokens=-1))
        assert await ledger.aflush(30)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            streamed = await c.post(CHAT, json={"messages": HELLO, "stream": True})
            text = (await c.get("/metrics")).text
    assert streamed.status_code == 200
    assert "sluicegate_ledger_write_errors_total 1.0" in text.splitlines()
    assert "sluicegate_ledger_repaired_rows_total 1.0" in text.splitlines()


# -- sluicegate usage over any row ---------------------------------------------------

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


def test_usage_over_a_first_release_file_with_odd_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file of the first release (no newer columns, never migrated) whose
    rows another program wrote: counts at the 64-bit limit that SQLite's SUM
    overflows, text, a real, an end state this version does not know."""
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute(_FIRST_SCHEMA)
        insert = (
            "INSERT INTO requests VALUES "
            "(?, ?, '/v1/x', NULL, 200, ?, ?, ?, '[]', 1, NULL, 2)"
        )
        db.executemany(
            insert,
            [
                ("a", "k1", "finished", MAX_COUNT, 1),
                ("b", "k1", "finished", MAX_COUNT, 2),
                ("c", "k1", "finished", MAX_COUNT, 3),
                ("d", "k2", "finished", "12", 2.75),  # text digits, a real
                ("e", "k2", "finished", "many", b"\x00"),  # counts 0
                ("f", "k2", "someday", 4, 5),
                ("g", "k2", OPEN, 1, 1),
            ],
        )
    db.close()
    totals = usage_totals(path)
    assert [(t.key_id, t.end_state, t.requests) for t in totals] == [
        ("k1", EndState.FINISHED, 3),
        ("k2", EndState.FINISHED, 2),
        ("k2", OPEN, 1),
        ("k2", "someday", 1),
    ]
    assert (totals[0].prompt_tokens, totals[0].completion_tokens) == (3 * MAX_COUNT, 6)
    assert (totals[1].prompt_tokens, totals[1].completion_tokens) == (12, 2)
    assert {t.reasoning_tokens for t in totals} == {0}  # no such column then
    assert main(["usage", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert str(3 * MAX_COUNT) in out
    assert "someday" in out


def test_usage_over_a_database_whose_sums_pass_64_bits(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = Ledger(url=postgres_url)
    for i in range(3):
        ledger.record(_row(f"r{i}", prompt_tokens=MAX_COUNT))
    ledger.record(_row("weird", completion_tokens=1))
    assert ledger.flush(30)
    ledger.close()
    with psycopg.connect(postgres_url, autocommit=True) as db:
        db.execute(
            "UPDATE requests SET end_state = 'someday' WHERE request_id = 'weird'"
        )
    totals = pg_usage_totals(postgres_url)
    assert [(t.end_state, t.requests, t.prompt_tokens) for t in totals] == [
        (EndState.FINISHED, 3, 3 * MAX_COUNT),
        ("someday", 1, 3),
    ]
    assert main(["usage", "--ledger", postgres_url]) == 0
    assert str(3 * MAX_COUNT) in capsys.readouterr().out


def test_a_lock_file_that_cannot_be_read_does_not_stop_the_writer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Marking dead servers' rows is housekeeping: a lock file it cannot open
    (here a folder where the file should be) is logged, and rows go on."""
    path = tmp_path / "ledger.sqlite3"
    first = Ledger(path)
    first.close()
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO requests (request_id, key_id, endpoint, status, end_state, "
            "prompt_tokens, completion_tokens, finish_reasons, received_at, "
            f"ended_at, server_id) VALUES ('old', 'k', '/', 200, '{OPEN}', 0, 0, "
            "'[]', 1, 2, 'abc123')"
        )
    db.close()
    (tmp_path / "ledger.sqlite3-servers" / "abc123.lock").mkdir(parents=True)
    with caplog.at_level(logging.ERROR):
        ledger = Ledger(path)
        ledger.record(_row("r"))
        assert ledger.flush(30)
    assert [row.request_id for row in read_rows(path)] == ["r"]
    assert any("dead servers not marked" in m for m in caplog.messages)
    ledger.close()
