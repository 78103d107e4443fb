"""The request ledger: one row per request, whatever its end, kept in SQLite.

Every request the server answers is recorded once it ends: rejected before
streaming, finished, errored in band, or aborted (the client went away or stopped
reading). A request the engine admitted has its row from then on, ``open`` in the
file until it ends; if its server dies first (``kill -9``, a crash), the next
server that opens the file marks it ``truncated``, with the tokens it had
delivered as of its last progress write. Token counts come from the server's own
metering, so a client that never sees a usage chunk is still counted.

Invariants:
    - The event loop never waits on SQLite: rows go to ``LedgerWriter``'s thread
      (``writer.py``), which commits them in order and retries while the
      file is locked; no row is dropped while the process lives. ``close``
      commits what is queued.
    - Every ``progress_interval_s`` (1 s), the open rows whose completion tokens
      changed get their counts written, so a crash loses at most that much
      metering of a running request.
    - Past ``max_backlog`` statements waiting for a locked file, ``behind`` turns
      true and the server refuses new requests with 503 (``ledger_behind``):
      what waits for the file stays bounded by what was already admitted, plus
      one row per refusal.
    - Rows carry a ``key_id`` (the key's name or hash), never an API key, and
      nothing of the prompt.
    - Whatever numbers reach it (an upstream's usage past 64 bits, NaN, a
      negative count), a row is written: a value neither SQLite nor PostgreSQL
      can store is repaired first (``values.py``: clamped, logged,
      counted in ``repaired_rows``, the usage marked estimated), and a
      statement the database still refuses is dropped alone, logged and
      counted (``write_errors``) while the writer goes on.
    - ``completion_tokens`` counts the tokens the server received from the
      engine, summed over choices, before and after an abort was asked for (the
      engine's in-flight step at the abort is counted by the engine as waste, in
      ``EngineStats.wasted_tokens``, not per request).

Deliberate divergences: the newest ``max_rows`` ended rows are also kept in memory
(``rows``, ``find``) for tests and ``/engine/stats`` callers; the file has all.
A row reaches the file milliseconds after its request ends, not before the
response's last byte (see ``writer.py``).

Spec: docs/DESIGN.md, "Metering" and "End states"; SQLite, "Write-Ahead Logging".

.. versionchanged:: 0.2.0
   Rows are written by a thread, retried while the file is locked (they were
   written on the event loop, which a locked file stalled for 5 s per row before
   the row was dropped), and each admitted request has an ``open`` row, so a
   crash leaves it ``truncated`` instead of leaving no row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sluicegate.engines.clocks import Timer, Timers
from sluicegate.server.ledger.file import OPEN
from sluicegate.server.ledger.read import read_rows, usage_totals
from sluicegate.server.ledger.rows import NAMES, LedgerRow, UsageTotal
from sluicegate.server.ledger.values import (
    COUNTS,
    TEXTS,
    TIMES,
    count,
    describe,
    repair,
    when,
)
from sluicegate.server.ledger.writer import LedgerWriter

if TYPE_CHECKING:
    from sluicegate.server.ledger.pg import PgLedgerWriter

__all__ = [
    "OPEN",
    "Ledger",
    "LedgerRow",
    "Progress",
    "UsageTotal",
    "read_rows",
    "usage_totals",
]

logger = logging.getLogger(__name__)

_COLUMNS = ", ".join(NAMES)
_INSERT = (
    f"INSERT INTO requests ({_COLUMNS}, server_id) "
    f"VALUES ({', '.join('?' * (len(NAMES) + 1))}) ON CONFLICT (request_id) "
)
_OPEN_SQL = _INSERT + "DO NOTHING"
_CLOSE_SQL = (
    _INSERT
    + "DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in (*NAMES[1:], "server_id"))
)
_PROGRESS_SQL = (
    "UPDATE requests SET completion_tokens = ?, first_token_at = ?, ended_at = ? "
    f"WHERE request_id = ? AND end_state = '{OPEN}'"
)

_CHECKED = (*TEXTS, *COUNTS, *TIMES)
"""The fields ``ledger_values.repair`` checks (the rest are built here)."""

Progress = Callable[[], tuple[int, float | None]]
"""A running request's completion tokens so far and its first token's Unix time."""


@dataclass(eq=False, slots=True)
class _Running:
    progress: Progress
    tokens: int = 0  # as last written


class Ledger:
    """One row per request: in memory (newest ``max_rows``) and, with ``path``, in
    an SQLite file written by one thread (``LedgerWriter``), or with ``url``, in
    a PostgreSQL database that replicas share (``ledger_pg.PgLedgerWriter``).

    Args:
        path: the SQLite file (created with its folder; an older ledger file is
            migrated); ``None``: memory only (unless ``url``).
        url: a ``postgresql://`` URL, instead of ``path`` (the tables are made
            when missing; psycopg is imported only then).
        lease_s: with ``url``: seconds after this server's last heartbeat past
            which a replica marks its open rows ``truncated``.
        max_rows: the most ended rows kept in memory; older rows go first.
            Each is an object that every full garbage collection walks.
        progress_interval_s: seconds between writes of open rows' token counts.
        max_backlog: statements waiting for the file past which ``behind``.
        close_timeout_s: how long ``close`` waits for a locked file.
        clock: what the progress timer runs on; default: the running event
            loop. Tests step a ``ManualClock``.

    Raises:
        sqlite3.Error: ``path`` is not an SQLite database.
        OSError: its folder cannot be made or written.
        ValueError: ``url`` is not a PostgreSQL URL, or both are given.
        ImportError: ``url`` without psycopg installed.
    """

    def __init__(
        self,
        path: Path | None = None,
        max_rows: int = 10_000,
        *,
        progress_interval_s: float = 1.0,
        max_backlog: int = 50_000,
        close_timeout_s: float = 30.0,
        url: str | None = None,
        lease_s: float = 10.0,
        clock: Timers | None = None,
    ) -> None:
        self.path = path
        self.url = url
        self._rows: deque[LedgerRow] = deque(maxlen=max_rows)
        self._running: dict[str, _Running] = {}
        self._progress_interval_s = progress_interval_s
        self._max_backlog = max_backlog
        self._clock = clock
        self._ticker: Timer | None = None
        self._writer: LedgerWriter | PgLedgerWriter | None = None
        self._dropped_before = 0  # by a writer closed since
        self.repaired_rows = 0
        """Rows written with values repaired so that they could be stored
        (``ledger_values.repair``), since the start."""
        if url is not None:
            if path is not None:
                raise ValueError(f"expected a path or a URL, got both: {path}")
            from sluicegate.server.ledger.pg import PgLedgerWriter

            self._writer = PgLedgerWriter(url, close_timeout_s, lease_s=lease_s)
        elif path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            _check_database(path)
            self._writer = LedgerWriter(path, close_timeout_s)

    @property
    def rows(self) -> list[LedgerRow]:
        """A copy of the in-memory rows, oldest first."""
        return list(self._rows)

    @property
    def durable(self) -> bool:
        """Whether rows go to a file or a database (a crash keeps them)."""
        return self.path is not None or self.url is not None

    @property
    def backlog(self) -> int:
        """Statements waiting to be committed to the file (0 without one)."""
        return 0 if self._writer is None else self._writer.backlog

    @property
    def write_errors(self) -> int:
        """Statements the writer could not write and dropped (each logged in
        full), since the start; the rest were written."""
        writer = self._writer
        return self._dropped_before + (0 if writer is None else writer.dropped)

    @property
    def behind(self) -> bool:
        """Whether ``max_backlog`` statements or more wait (the file is locked)."""
        return self._writer is not None and self._writer.backlog >= self._max_backlog

    def open(self, row: LedgerRow, progress: Progress) -> None:
        """Write an ``open`` row for an admitted request; ``record`` ends it.

        ``row`` is the request as admitted (its ``end_state`` is not used);
        ``progress`` is called on the event loop every ``progress_interval_s``
        until ``record``, and its counts written when they changed. Must be
        called on the event loop (the first call starts that timer there).
        """
        writer = self._writer
        if writer is None:
            return
        row = self._storable(row)
        self._running[row.request_id] = _Running(progress, row.completion_tokens)
        writer.put(_OPEN_SQL, _values(row, OPEN, writer.server_id))
        if self._ticker is None:
            self._schedule(self._clock or asyncio.get_running_loop())

    def record(self, row: LedgerRow) -> LedgerRow:
        """Append the ended ``row``; it goes to the file in order, off the loop.

        Never blocks and never raises for the file: a locked file is retried by
        the writer thread (see ``writer.py``), and a value the file
        cannot store is repaired first (``ledger_values.repair``: logged,
        counted in ``repaired_rows``, the usage marked estimated).

        Returns:
            The row as kept: ``row``, or its repaired copy.
        """
        row = self._storable(row)
        self._rows.append(row)
        writer = self._writer
        if writer is None:
            return row
        self._running.pop(row.request_id, None)
        writer.put(_CLOSE_SQL, _values(row, str(row.end_state), writer.server_id))
        return row

    def _storable(self, row: LedgerRow) -> LedgerRow:
        """``row``, or a copy whose values SQLite and PostgreSQL can store."""
        fields = {name: getattr(row, name) for name in _CHECKED}
        changed, problems = repair(fields)
        if not changed:
            return row
        self.repaired_rows += 1
        logger.warning(
            "ledger: request %s has values no ledger can store (%s); written "
            "repaired, its usage marked estimated",
            describe(row.request_id),
            "; ".join(problems),
        )
        return dataclasses.replace(row, **changed, usage_estimated=True)

    def find(self, request_id: str) -> LedgerRow | None:
        """The in-memory row of ``request_id``, or ``None``."""
        return next((r for r in self._rows if r.request_id == request_id), None)

    async def read_newest(
        self, newest: int, request_id: str | None = None
    ) -> list[LedgerRow]:
        """The newest ``newest`` ended rows of the file or database (every
        server's that writes there), oldest first, read off the event loop;
        ``request_id``: only its row. Without either, the rows in memory.

        Raises:
            sqlite3.Error, psycopg.Error: the file or database cannot be read.
        """
        if self.url is not None:
            from sluicegate.server.ledger.pg_read import read_rows as read_db

            return await asyncio.to_thread(
                read_db, self.url, newest=newest, request_id=request_id
            )
        if self.path is None:
            found = self.find(request_id) if request_id else None
            rows = self.rows if request_id is None else [found] if found else []
            return rows[-newest:]
        return await asyncio.to_thread(
            read_rows, self.path, newest=newest, request_id=request_id
        )

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait (blocking this thread) until every row so far is in the file.

        Returns:
            False when ``timeout_s`` seconds passed first; True without a file.
        """
        return self._writer is None or self._writer.flush(timeout_s)

    async def aflush(self, timeout_s: float | None = None) -> bool:
        """``flush`` without blocking the event loop."""
        if self._writer is None:
            return True
        return await asyncio.to_thread(self._writer.flush, timeout_s)

    def close(self) -> None:
        """Commit what is queued, checkpoint and close the file (blocks up to
        ``close_timeout_s`` while it is locked); later rows stay in memory only.
        Call it on the event loop, or use ``aclose``."""
        self._stop_ticker()
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            self._dropped_before += writer.dropped

    async def aclose(self) -> None:
        """``close`` without blocking the event loop."""
        self._stop_ticker()
        writer, self._writer = self._writer, None
        if writer is not None:
            await asyncio.to_thread(writer.close)
            self._dropped_before += writer.dropped

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    def _schedule(self, clock: Timers) -> None:
        due = clock.time() + self._progress_interval_s
        self._ticker = clock.call_at(due, lambda: self._tick(clock))

    def _tick(self, clock: Timers) -> None:
        writer = self._writer
        if writer is None:
            return
        now = time.time()
        for request_id, running in self._running.items():
            tokens, first_token_at = running.progress()
            if tokens != running.tokens:
                running.tokens = tokens
                params = (count(tokens), when(first_token_at), now, request_id)
                writer.put(_PROGRESS_SQL, params)
        self._schedule(clock)


def _values(row: LedgerRow, state: str, server_id: str) -> tuple[object, ...]:
    return (
        row.request_id,
        row.key_id,
        row.endpoint,
        row.model,
        row.status,
        state,
        row.prompt_tokens,
        row.completion_tokens,
        json.dumps([r and str(r) for r in row.finish_reasons]),
        row.received_at,
        row.first_token_at,
        row.ended_at,
        int(row.usage_estimated),
        row.resumed,
        row.reasoning_tokens,
        server_id,
    )


def _check_database(path: Path) -> None:
    """Raise now if ``path`` is not an SQLite file (the writer retries the rest)."""
    db = sqlite3.connect(path, timeout=0.1)
    try:
        db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as exc:
        if exc.sqlite_errorcode & 0xFF not in (
            sqlite3.SQLITE_BUSY,
            sqlite3.SQLITE_LOCKED,
        ):
            raise
    finally:
        db.close()
