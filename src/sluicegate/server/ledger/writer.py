"""The ledger file's one writer: the writer thread over an SQLite backend.

``LedgerWriter`` is ``WriterThread`` (``thread.py``: the queue, batches,
retries, drops) writing through ``SqliteBackend``, which owns the only
connection a server writes its ledger file with. A transaction is retried while
SQLite refuses it for a reason that may pass: ``database is locked`` (a backup,
a ``sqlite3`` shell in ``BEGIN EXCLUSIVE``), a full disk, an I/O error. A
statement SQLite refuses for its own data (a constraint: a bug), or whose
values cannot be bound (an integer past 64 bits, a lone surrogate; ``Ledger``
repairs these first), is dropped alone and logged.

Invariants:
    - At start, before any row: the schema is created or migrated (version 1,
      the first release's table, gets ``server_id`` and an index of open rows;
      version 2 gets ``usage_estimated``: ``file.py``),
      then rows left ``open`` by servers that died are marked ``truncated``.
    - Whether a server is alive is told by a lock: each writer holds an
      exclusive ``flock`` on ``<ledger>-servers/<server_id>.lock`` for its life
      (the kernel releases it when the process dies, ``kill -9`` included), so
      servers sharing one file never mark each other's running requests
      (``locks.py``).

Deliberate divergence: a row reaches the file a few milliseconds after the
request ends (at once while nothing holds a lock), not before its response's
last byte: a ``kill -9`` in that window leaves the request's admission row,
which the next server marks ``truncated``. ``close`` waits ``close_timeout_s``
for a locked file, then logs what it could not write, one JSON line per row.

Spec: docs/DESIGN.md, "Metering"; SQLite, "Result and Error Codes"
(``SQLITE_BUSY``), "Write-Ahead Logging", "UPSERT"; flock(2).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import uuid
from collections.abc import Sequence
from pathlib import Path

from sluicegate.server.ledger.file import (
    OPEN,
    Statement,
    connect,
    migrate,
    transaction,
)
from sluicegate.server.ledger.locks import (
    alive,
    hold_lock,
    release_lock,
    servers_dir,
    sweep_locks,
)
from sluicegate.server.ledger.thread import Retry, WriterThread

__all__ = ["LedgerWriter", "SqliteBackend"]

logger = logging.getLogger(__name__)

_BUSY_TIMEOUT_S = 0.1  # SQLite's own wait per try; the backoff is ours


class LedgerWriter(WriterThread):
    """The thread that commits ledger statements to a file; see the module docstring.

    Args:
        path: the ledger file (its folder exists).
        close_timeout_s: how long ``close`` waits for a locked file.

    Attributes:
        server_id: 32 hex digits naming this writer in its rows and its lock.
    """

    def __init__(self, path: Path, close_timeout_s: float = 30.0) -> None:
        self.path = path
        server_id = uuid.uuid4().hex
        backend = SqliteBackend(path, server_id)
        super().__init__(
            backend, server_id, close_timeout_s, name=f"ledger-writer {path.name}"
        )


class SqliteBackend:
    """The ledger file as a ``LedgerBackend``: one connection, and this server's
    lock held from construction until ``close``.

    Args:
        path: the ledger file (its folder exists).
        server_id: this writer's id, which names its lock file.
    """

    away = "stayed locked"
    max_batch = 4096
    heartbeat_s: float | None = None
    transient: type[Exception] = sqlite3.Error
    refused: tuple[type[Exception], ...] = (
        sqlite3.IntegrityError,
        sqlite3.DataError,
        sqlite3.ProgrammingError,
        sqlite3.InterfaceError,
    )
    """What SQLite says about the statement itself: retrying cannot help."""

    def __init__(self, path: Path, server_id: str) -> None:
        self.path = path
        self.where = str(path)
        self._server_id = server_id
        self._db: sqlite3.Connection | None = None
        self._lock_fd = hold_lock(servers_dir(path), server_id)

    def start(self, retry: Retry) -> None:
        """Open the file (its schema made or migrated), then mark the open rows
        of servers that died ``truncated``."""
        db = self._db = retry(self._open, "open the ledger")
        try:
            retry(lambda: self._mark_dead_servers(db), "mark dead servers' rows")
        except OSError as exc:  # a lock file we may not read: rows come first
            logger.error("ledger %s: dead servers not marked: %s", self.path, exc)

    def beat(self, retry: Retry) -> None:
        """No heartbeat (``heartbeat_s`` is None): never called."""

    def write(self, batch: Sequence[Statement]) -> None:
        """``batch`` in one ``BEGIN IMMEDIATE`` transaction."""
        assert self._db is not None
        transaction(self._db, batch)

    def recover(self) -> None:
        """Nothing to drop: the connection outlives a locked file."""

    def close(self) -> None:
        """Checkpoint and close the file, then release this server's lock."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
        release_lock(servers_dir(self.path), self._server_id, self._lock_fd)

    def _open(self) -> sqlite3.Connection:
        db = connect(self.path, _BUSY_TIMEOUT_S)
        try:
            migrate(db)
        except BaseException:
            db.close()
            raise
        return db

    def _mark_dead_servers(self, db: sqlite3.Connection) -> None:
        """Rows left open by servers that no longer run: ``truncated``."""
        cursor = db.execute(
            f"SELECT DISTINCT server_id FROM requests WHERE end_state = '{OPEN}'"
        )
        owners = [owner for (owner,) in cursor]
        folder = servers_dir(self.path)
        # A server_id that is not text (a row another program wrote) names no
        # lock: its rows are a dead server's.
        dead = [
            o
            for o in owners
            if o != self._server_id and not (isinstance(o, str) and alive(folder, o))
        ]
        if not dead:
            sweep_locks(folder)
            return
        marked = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            for owner in dead:
                marked += db.execute(
                    "UPDATE requests SET end_state = 'truncated' "
                    f"WHERE end_state = '{OPEN}' AND server_id IS ?",
                    (owner,),
                ).rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        logger.warning(
            "ledger %s: %d requests of %d servers that died marked truncated",
            self.path,
            marked,
            len(dead),
        )
        sweep_locks(folder)
