"""The ledger file in SQLite: its table, a connection to it, and its migration.

``connect`` opens the file in WAL mode and creates the ``requests`` table when
it is missing; ``migrate`` brings a table of an older release to
``SCHEMA_VERSION`` in one transaction: version 1 (the first release's table) gets
``server_id`` and an index of the ``open`` rows, version 2 gets
``usage_estimated``, version 3 gets ``resumed``, version 4 gets
``reasoning_tokens``. ``transaction`` runs statements
in one ``BEGIN IMMEDIATE`` transaction, all or none.

Spec: SQLite, "Write-Ahead Logging", "ALTER TABLE", "PRAGMA user_version".
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Final

__all__ = ["OPEN", "SCHEMA_VERSION", "Statement", "connect", "migrate", "transaction"]

OPEN: Final = "open"
"""The ``end_state`` in the file of a request that has not ended yet."""

SCHEMA_VERSION = 5
"""``PRAGMA user_version`` of a current ledger file (0 or 1: the first release;
2: before ``usage_estimated``; 3: before ``resumed``; 4: before
``reasoning_tokens``)."""

_TABLE = """
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
    ended_at REAL NOT NULL,
    usage_estimated INTEGER NOT NULL DEFAULT 0,
    resumed INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens INTEGER NOT NULL DEFAULT 0
)
"""
_OPEN_INDEX = (
    "CREATE INDEX IF NOT EXISTS requests_open ON requests (server_id) "
    f"WHERE end_state = '{OPEN}'"
)

Statement = tuple[str, Sequence[object]]
"""An SQL statement and its parameters."""


def connect(path: Path, busy_timeout_s: float = 5.0) -> sqlite3.Connection:
    """A connection to the ledger file at ``path``, in WAL mode, its table made.

    Args:
        busy_timeout_s: how long each statement waits for another connection's
            lock before it fails with ``database is locked`` (seconds).

    Raises:
        sqlite3.Error: ``path`` is not an SQLite file, or it stayed locked.
    """
    db = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_TABLE)
    except BaseException:
        db.close()
        raise
    return db


def transaction(db: sqlite3.Connection, batch: Sequence[Statement]) -> None:
    """Run ``batch`` in one transaction: every statement committed, or none.

    Raises:
        sqlite3.Error: what SQLite raised; the transaction is rolled back.
    """
    db.execute("BEGIN IMMEDIATE")
    try:
        for sql, params in batch:
            db.execute(sql, params)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def migrate(db: sqlite3.Connection) -> None:
    """Bring the table to ``SCHEMA_VERSION``, in one transaction.

    Raises:
        sqlite3.Error: what SQLite raised; the table is left as it was.
    """
    (version,) = db.execute("PRAGMA user_version").fetchone()
    if version >= SCHEMA_VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        columns = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
        if "server_id" not in columns:
            db.execute("ALTER TABLE requests ADD COLUMN server_id TEXT")
        if "usage_estimated" not in columns:
            db.execute(
                "ALTER TABLE requests ADD COLUMN "
                "usage_estimated INTEGER NOT NULL DEFAULT 0"
            )
        for name in ("resumed", "reasoning_tokens"):
            if name not in columns:
                db.execute(
                    f"ALTER TABLE requests ADD COLUMN {name} INTEGER NOT NULL DEFAULT 0"
                )
        db.execute(_OPEN_INDEX)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
