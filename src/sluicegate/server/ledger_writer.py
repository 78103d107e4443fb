"""The ledger file's one writer: a thread that commits rows off the event loop.

``LedgerWriter`` owns the only connection a server writes its ledger file with.
The event loop hands it statements with ``put`` (a ``queue.SimpleQueue``: never
full, never blocks); the thread takes everything queued, commits it in one
transaction, and retries that transaction while SQLite refuses it for a reason
that may pass: ``database is locked`` (a backup, a ``sqlite3`` shell in
``BEGIN EXCLUSIVE``), a full disk, an I/O error.

Invariants:
    - The event loop never waits on SQLite, nor on this thread's lock: ``put``
      appends to a queue.
    - A statement leaves the queue for good only once committed, in the order
      put. Retries back off from 10 ms to 1 s, for as long as the process lives;
      a warning is logged at the first failure and every 30 s after, and once
      the batch is committed. Only a statement that cannot be written whatever
      the retries is dropped, alone (the batch is halved until it is found),
      logged in full and counted (``dropped``): SQLite refuses it for its own
      data (a constraint: a bug), or its values cannot be bound (an integer past
      64 bits, a lone surrogate; ``Ledger`` repairs these first). No statement
      ends the thread.
    - At start, before any row: the schema is created or migrated (version 1,
      the first release's table, gets ``server_id`` and an index of open rows;
      version 2 gets ``usage_estimated``: ``ledger_file.py``),
      then rows left ``open`` by servers that died are marked ``truncated``.
    - Whether a server is alive is told by a lock: each writer holds an
      exclusive ``flock`` on ``<ledger>-servers/<server_id>.lock`` for its life
      (the kernel releases it when the process dies, ``kill -9`` included), so
      servers sharing one file never mark each other's running requests
      (``ledger_locks.py``).

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
import json
import logging
import queue
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sluicegate.server.ledger_file import (
    OPEN,
    Statement,
    connect,
    migrate,
    transaction,
)
from sluicegate.server.ledger_locks import (
    alive,
    hold_lock,
    release_lock,
    servers_dir,
    sweep_locks,
)
from sluicegate.server.ledger_values import plain

__all__ = ["LedgerWriter"]

logger = logging.getLogger(__name__)

_FIRST_DELAY_S = 0.01
_MAX_DELAY_S = 1.0
_LOG_EVERY_S = 30.0
_BUSY_TIMEOUT_S = 0.1  # SQLite's own wait per try; the backoff is ours
_MAX_BATCH = 4096  # statements per transaction

_T = TypeVar("_T")


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class _Stop:
    pass


class _Abandoned(Exception):
    """``close`` stopped waiting: the thread logs what it holds and ends."""


class LedgerWriter:
    """The thread that commits ledger statements; see the module docstring.

    Args:
        path: the ledger file (its folder exists).
        close_timeout_s: how long ``close`` waits for a locked file.

    Attributes:
        server_id: 32 hex digits naming this writer in its rows and its lock.
    """

    def __init__(self, path: Path, close_timeout_s: float = 30.0) -> None:
        self.path = path
        self.server_id = uuid.uuid4().hex
        self._close_timeout_s = close_timeout_s
        self._queue: queue.SimpleQueue[Statement | _Flush | _Stop] = queue.SimpleQueue()
        self._in_hand = 0  # statements taken off the queue, not committed yet
        self.dropped = 0
        """Statements that could not be written and were dropped (logged)."""
        self._abandon = threading.Event()
        self._lock_fd = hold_lock(servers_dir(path), self.server_id)
        self._thread = threading.Thread(
            target=self._run, name=f"ledger-writer {path.name}", daemon=True
        )
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Statements put and not committed yet (approximate while it writes)."""
        return self._queue.qsize() + self._in_hand

    def put(self, sql: str, params: Sequence[object]) -> None:
        """Queue one statement; it is committed after every one put before it."""
        self._queue.put((sql, params))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every statement put so far is committed.

        Blocks the calling thread (not for the event loop: see ``Ledger.aflush``).

        Returns:
            False if ``timeout_s`` seconds passed first (the file is locked).
        """
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def close(self) -> None:
        """Commit what is queued (``close_timeout_s`` at most), then stop.

        What a file locked past that time kept out is logged, one JSON line per
        statement. Blocks the calling thread; later calls do nothing.
        """
        if not self._thread.is_alive():
            return
        self._queue.put(_Stop())
        self._thread.join(self._close_timeout_s)
        if self._thread.is_alive():
            self._abandon.set()
            self._thread.join()

    # -- the thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            db = self._retry(self._open, "open the ledger")
        except _Abandoned:
            self._log_unwritten()
            release_lock(servers_dir(self.path), self.server_id, self._lock_fd)
            return
        try:
            try:
                self._retry(
                    lambda: self._mark_dead_servers(db), "mark dead servers' rows"
                )
            except OSError as exc:  # a lock file we may not read: rows come first
                logger.error("ledger %s: dead servers not marked: %s", self.path, exc)
            while self._serve(db):
                pass
        except _Abandoned:
            self._log_unwritten()
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            db.close()
            release_lock(servers_dir(self.path), self.server_id, self._lock_fd)

    def _serve(self, db: sqlite3.Connection) -> bool:
        """Commit one batch; False once told to stop."""
        batch: list[Statement] = []
        markers: list[_Flush | _Stop] = []
        item = self._queue.get()
        while True:
            if isinstance(item, _Flush | _Stop):
                markers.append(item)
            else:
                batch.append(item)
            if len(batch) >= _MAX_BATCH:
                break
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
        self._in_hand = len(batch)
        try:
            if batch:
                self._commit(db, batch)
        except _Abandoned:
            self._requeue(batch, markers)
            raise
        self._in_hand = 0
        for marker in markers:
            if isinstance(marker, _Flush):
                marker.done.set()
        return not any(isinstance(m, _Stop) for m in markers)

    def _requeue(self, batch: list[Statement], markers: list[_Flush | _Stop]) -> None:
        # What is in hand goes first among what _log_unwritten reads.
        rest: list[Statement | _Flush | _Stop] = [*batch, *markers]
        with contextlib.suppress(queue.Empty):
            while True:
                rest.append(self._queue.get_nowait())
        for item in rest:
            self._queue.put(item)

    def _commit(self, db: sqlite3.Connection, batch: Sequence[Statement]) -> None:
        try:
            self._retry(lambda: transaction(db, batch), "write rows")
        except _Abandoned:
            raise
        except Exception as exc:  # the statement itself: see _drop
            if len(batch) > 1:  # find the statement it was (halves); keep the rest
                half = len(batch) // 2
                self._commit(db, batch[:half])
                self._commit(db, batch[half:])
                return
            self._drop(batch[0], exc)

    def _drop(self, statement: Statement, exc: Exception) -> None:
        """One statement that cannot be written, whatever retries: SQLite
        refuses it (a constraint: a bug), or its values cannot be bound (an
        integer past 64 bits, a string it cannot encode). It is logged in full
        and counted; the thread goes on with the rest. Any exception counts:
        a statement must never end the thread that writes every later row."""
        self.dropped += 1
        logger.error(
            "ledger: a row cannot be written (%s: %s); dropped: %s",
            type(exc).__name__,
            exc,
            _describe(statement),
        )

    def _retry(self, work: Callable[[], _T], what: str) -> _T:
        """``work()`` until SQLite stops refusing it for a reason that may pass."""
        delay_s, failed_at, logged_at = _FIRST_DELAY_S, 0.0, 0.0
        while True:
            try:
                result = work()
            except _REFUSED:
                raise
            except sqlite3.Error as exc:
                now = time.monotonic()
                if not failed_at:
                    failed_at = now
                if now - logged_at >= _LOG_EVERY_S:
                    logged_at = now
                    logger.warning(
                        "ledger %s: could not %s for %.1f s (%s); %d rows wait, "
                        "retrying",
                        self.path,
                        what,
                        now - failed_at,
                        exc,
                        self.backlog,
                    )
                if self._abandon.wait(delay_s):
                    raise _Abandoned from exc
                delay_s = min(delay_s * 2, _MAX_DELAY_S)
                continue
            if failed_at:
                logger.warning(
                    "ledger %s: could %s again after %.1f s",
                    self.path,
                    what,
                    time.monotonic() - failed_at,
                )
            return result

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
            if o != self.server_id and not (isinstance(o, str) and alive(folder, o))
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

    def _log_unwritten(self) -> None:
        lost = 0
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._queue.get_nowait()
                if isinstance(item, _Flush):
                    item.done.set()
                elif not isinstance(item, _Stop):
                    lost += 1
                    logger.error("ledger: not written: %s", _describe(item))
        if lost:
            logger.error(
                "ledger %s: stayed locked for %g s at shutdown; %d statements "
                "logged above instead",
                self.path,
                self._close_timeout_s,
                lost,
            )


_REFUSED = (
    sqlite3.IntegrityError,
    sqlite3.DataError,
    sqlite3.ProgrammingError,
    sqlite3.InterfaceError,
)
"""What SQLite says about the statement itself: retrying cannot help."""


def _describe(statement: Statement) -> str:
    """A statement as one JSON line: its first words and its values, each value
    that is not a plain JSON scalar (or is a long one) by its short ``repr``."""
    sql, params = statement
    return json.dumps({"sql": " ".join(sql.split()[:3]), "params": plain(params)})
