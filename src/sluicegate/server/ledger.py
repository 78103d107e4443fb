"""The request ledger: one row per request, whatever its end, kept in SQLite.

Every request the server answers is recorded once, when it ends: rejected before
streaming, finished, errored in band, or aborted (the client went away or stopped
reading). Token counts come from the server's own metering, so a client that never
sees a usage chunk is still counted.

Invariants:
    - ``record`` commits the row before it returns (SQLite WAL, one transaction
      per row, ``synchronous=NORMAL``): the response's last byte goes out after
      its row is committed, so a ``kill -9`` of the server loses no row of a
      request that had ended. (WAL with ``NORMAL`` survives a process crash; a
      power loss may lose the last commits.)
    - Rows carry a ``key_id`` (the key's name or hash), never an API key, and
      nothing of the prompt.
    - ``completion_tokens`` counts the tokens the server received from the
      engine, summed over choices, before and after an abort was asked for (the
      engine's in-flight step at the abort is counted by the engine as waste, in
      ``EngineStats.wasted_tokens``, not per request).

Deliberate divergence: the newest ``max_rows`` rows are also kept in memory
(``rows``, ``find``) for tests and ``/engine/stats`` callers; the file has all.

Spec: ../shared/DESIGN.md, "Metering" and "Every stream ends in exactly one state";
issue 5, "Metering ledger"; SQLite, "Write-Ahead Logging".
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason

__all__ = ["Ledger", "LedgerRow", "UsageTotal", "read_rows", "usage_totals"]

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
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
_COLUMNS = (
    "request_id, key_id, endpoint, model, status, end_state, prompt_tokens, "
    "completion_tokens, finish_reasons, received_at, first_token_at, ended_at"
)


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One request, as it ended.

    Attributes:
        request_id: the response id (``chatcmpl-...``/``cmpl-...``).
        endpoint: the URL path, e.g. ``/v1/chat/completions``.
        model: the model name the response carries (``None`` if rejected before
            the model was known).
        status: the HTTP status sent (200 for every stream that started; 499
            when the client left before any status was sent).
        end_state: rejected, finished, errored or aborted.
        prompt_tokens: prompt length (tokens; 0 if rejected before tokenizing).
        completion_tokens: tokens received from the engine, summed over choices,
            including those received before an abort or error.
        finish_reasons: per choice, its finish reason or ``None``.
        received_at, first_token_at, ended_at: Unix times (seconds);
            ``first_token_at`` is ``None`` when no token arrived.
        key_id: the API key's id (``anonymous`` without keys), never the key.
    """

    request_id: str
    endpoint: str
    model: str | None
    status: int
    end_state: EndState
    prompt_tokens: int
    completion_tokens: int
    finish_reasons: tuple[FinishReason | None, ...]
    received_at: float
    first_token_at: float | None
    ended_at: float
    key_id: str = "anonymous"


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """Totals of one (key, end state) pair; tokens in tokens."""

    key_id: str
    end_state: EndState
    requests: int
    prompt_tokens: int
    completion_tokens: int


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(_SCHEMA)
    return db


class Ledger:
    """One row per request: in memory (newest ``max_rows``) and, with ``path``, in
    an SQLite file.

    Args:
        path: the SQLite file (created with its folder); ``None``: memory only.
        max_rows: the most rows kept in memory; older rows are dropped first.

    Raises:
        sqlite3.Error: ``path`` cannot be opened as an SQLite database.
    """

    def __init__(self, path: Path | None = None, max_rows: int = 100_000) -> None:
        self.path = path
        self._rows: deque[LedgerRow] = deque(maxlen=max_rows)
        self._db = _connect(path) if path is not None else None

    @property
    def rows(self) -> list[LedgerRow]:
        """A copy of the in-memory rows, oldest first."""
        return list(self._rows)

    def record(self, row: LedgerRow) -> None:
        """Append ``row`` and commit it to the file before returning.

        A failing write (disk full) is logged, not raised: the response it
        belongs to has ended already.
        """
        self._rows.append(row)
        if self._db is None:
            return
        values = (
            row.request_id,
            row.key_id,
            row.endpoint,
            row.model,
            row.status,
            str(row.end_state),
            row.prompt_tokens,
            row.completion_tokens,
            json.dumps([r and str(r) for r in row.finish_reasons]),
            row.received_at,
            row.first_token_at,
            row.ended_at,
        )
        try:
            self._db.execute(
                f"INSERT INTO requests ({_COLUMNS}) VALUES ({', '.join('?' * 12)})",
                values,
            )
        except sqlite3.Error:
            logger.exception("ledger: could not record %s", row.request_id)

    def find(self, request_id: str) -> LedgerRow | None:
        """The in-memory row of ``request_id``, or ``None``."""
        return next((r for r in self._rows if r.request_id == request_id), None)

    def close(self) -> None:
        """Checkpoint and close the file; ``record`` keeps rows in memory only."""
        if self._db is not None:
            db, self._db = self._db, None
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()


def read_rows(path: Path) -> list[LedgerRow]:
    """Every row of the ledger file at ``path``, in order of end.

    Raises:
        sqlite3.Error: not a ledger file.
    """
    db = _connect(path)
    try:
        cursor = db.execute(f"SELECT {_COLUMNS} FROM requests ORDER BY ended_at")
        return [_row(values) for values in cursor]
    finally:
        db.close()


def _row(values: tuple[object, ...]) -> LedgerRow:
    (rid, key_id, endpoint, model, status, state, prompt, completion) = values[:8]
    reasons, received, first, ended = values[8:]
    assert isinstance(reasons, str)
    return LedgerRow(
        request_id=str(rid),
        endpoint=str(endpoint),
        model=None if model is None else str(model),
        status=int(str(status)),
        end_state=EndState(str(state)),
        prompt_tokens=int(str(prompt)),
        completion_tokens=int(str(completion)),
        finish_reasons=tuple(r and FinishReason(r) for r in json.loads(reasons)),
        received_at=float(str(received)),
        first_token_at=None if first is None else float(str(first)),
        ended_at=float(str(ended)),
        key_id=str(key_id),
    )


def usage_totals(path: Path) -> list[UsageTotal]:
    """Requests and tokens per (key id, end state), sorted by key then state.

    Raises:
        sqlite3.Error: not a ledger file.
    """
    db = _connect(path)
    try:
        cursor = db.execute(
            "SELECT key_id, end_state, COUNT(*), SUM(prompt_tokens), "
            "SUM(completion_tokens) FROM requests "
            "GROUP BY key_id, end_state ORDER BY key_id, end_state"
        )
        return [
            UsageTotal(key, EndState(state), n, prompt, completion)
            for key, state, n, prompt, completion in cursor
        ]
    finally:
        db.close()
