"""The PostgreSQL ledger's writer: a thread that commits rows off the event loop.

``PgLedgerWriter`` is ``LedgerWriter`` (``ledger_writer.py``) for a database
that many replicas share: the same methods, the same statements (``Ledger``
builds them; ``?`` placeholders become psycopg's ``%s``), one psycopg
connection of its own. The event loop hands it statements with ``put`` (a
``queue.SimpleQueue``: never full, never blocks); the thread takes everything
queued, commits it in one transaction (runs of one statement as one
``executemany``, pipelined), and retries while PostgreSQL is unreachable,
restarting, or refuses for a reason that may pass, reconnecting as needed.

Invariants:
    - The event loop never waits on PostgreSQL: ``put`` appends to a queue.
    - A statement leaves the queue for good only once committed, in the order
      put. Retries back off from 10 ms to 1 s for as long as the process
      lives; a warning is logged at the first failure, every 30 s after, and
      once the rows are committed. Only a statement that cannot be written
      whatever the retries is dropped, alone (the batch is halved until it is
      found), logged in full and counted (``dropped``): PostgreSQL refuses it
      for its own data or text (a constraint, a type, a number out of range),
      or psycopg cannot send its values. No statement ends the thread.
    - Before any row, and again on every reconnection: the schema is created
      or completed, and this writer's lease taken (``ledger_pg_schema.py``).
      Every ``heartbeat_interval_s`` the lease is renewed and the open rows of
      servers whose lease expired are marked ``truncated``: a replica killed
      with ``kill -9`` has its running requests marked by any replica still
      alive, within ``lease_s`` and one heartbeat.
    - Each server writes only its own rows (``server_id``) but may mark any
      dead server's: replicas never mark each other's running requests while
      their leases are renewed.

Why a thread and psycopg, not asyncpg on the event loop: measured on the same
batches (``bench/ledger.py``), asyncpg commits faster and with less CPU, but it
would spend that CPU on the event loop, and ``Ledger``'s ``flush`` and
``close`` block their caller, which a task on the loop they block cannot serve.
One writer needs one connection, so there is no pool: a broken connection is
replaced by the retry loop.

Deliberate divergence: as for SQLite, a row reaches the database a few
milliseconds after its request ends; a ``kill -9`` in that window leaves the
admission row, marked ``truncated`` once the lease expires. ``close`` waits
``close_timeout_s`` for the database, then logs what it could not write, one
JSON line per statement.

Spec: docs/DESIGN.md, "Metering"; PostgreSQL, "Errors and Messages" (SQLSTATE
classes); psycopg 3, "Pipeline mode", "Transactions management".
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - psycopg is in the dev set
    raise ImportError(
        "a PostgreSQL ledger needs psycopg: pip install 'sluicegate[postgres]'"
    ) from exc

from sluicegate.server.ledger_file import Statement
from sluicegate.server.ledger_pg_schema import (
    ensure_schema,
    redact,
    release,
    renew,
    translate,
)
from sluicegate.server.ledger_values import plain

__all__ = ["PgLedgerWriter"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Db = psycopg.Connection[tuple[object, ...]]
_FIRST_DELAY_S = 0.01
_MAX_DELAY_S = 1.0
_LOG_EVERY_S = 30.0
_MAX_BATCH = 1000
_CONNECT_TIMEOUT_S = 5


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


class _Stop:
    pass


class _Abandoned(Exception):
    """``close`` gave up waiting for the database."""


_REFUSED = (psycopg.IntegrityError, psycopg.DataError, psycopg.ProgrammingError)
"""What PostgreSQL (or psycopg) says about the statement itself: retrying
cannot help (SQLSTATE classes 22, 23 and 42)."""


class PgLedgerWriter:
    """Commits statements to the ledger at ``url``, in order, from one thread.

    Args:
        url: a libpq URL (``postgresql://user:password@host:port/database``).
        close_timeout_s: how long ``close`` waits for the database (seconds).
        lease_s: how long this server counts as alive after its last renewal
            (seconds, > 0); its open rows are marked ``truncated`` once it
            expires.
        heartbeat_interval_s: seconds between renewals; default: a third of
            ``lease_s``, 1 s at most.

    Raises:
        ValueError: ``url`` is not a libpq URL, or ``lease_s`` is not > 0.
    """

    def __init__(
        self,
        url: str,
        close_timeout_s: float = 30.0,
        *,
        lease_s: float = 10.0,
        heartbeat_interval_s: float | None = None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"expected a PostgreSQL URL, got {redact(url)!r}") from exc
        self.url = url
        self.where = redact(url)
        self.server_id = uuid.uuid4().hex
        self._lease_s = lease_s
        self._heartbeat_s = heartbeat_interval_s or min(1.0, lease_s / 3)
        self._close_timeout_s = close_timeout_s
        self._queue: queue.SimpleQueue[Statement | _Flush | _Stop] = queue.SimpleQueue()
        self._in_hand = 0  # statements taken off the queue, not committed yet
        self.dropped = 0
        """Statements that could not be written and were dropped (logged)."""
        self._abandon = threading.Event()
        self._db: _Db | None = None
        self._renewed_at = float("-inf")  # time.monotonic() of the last renewal
        self._thread = threading.Thread(
            target=self._run, name="ledger-writer postgresql", daemon=True
        )
        self._thread.start()

    @property
    def backlog(self) -> int:
        """Statements put and not committed yet (approximate while it writes)."""
        return self._queue.qsize() + self._in_hand

    def put(self, sql: str, params: Sequence[object]) -> None:
        """Queue one statement (``?`` placeholders); committed after those before."""
        self._queue.put((sql, params))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every statement put so far is committed (blocks this thread).

        Returns:
            False if ``timeout_s`` seconds passed first (the database is away).
        """
        marker = _Flush()
        self._queue.put(marker)
        return marker.done.wait(timeout_s)

    def close(self) -> None:
        """Commit what is queued (``close_timeout_s`` at most), give the lease
        back, then stop. Blocks the calling thread; later calls do nothing."""
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
            while self._serve():
                pass
        except _Abandoned:
            self._log_unwritten()
        finally:
            db, self._db = self._db, None
            if db is not None:
                with contextlib.suppress(psycopg.Error):
                    release(db, self.server_id)
                db.close()

    def _serve(self) -> bool:
        """Renew the lease if due, then commit one batch; False once told to stop."""
        self._retry(self._renew_if_due, "renew the lease")
        wait_s = self._renewed_at + self._heartbeat_s - time.monotonic()
        try:
            item = self._queue.get(timeout=max(wait_s, 0.001))
        except queue.Empty:
            return True
        batch: list[Statement] = []
        markers: list[_Flush | _Stop] = []
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
                self._commit(batch)
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

    def _commit(self, batch: Sequence[Statement]) -> None:
        try:
            self._retry(lambda db: _transaction(db, batch), "write rows")
        except _Abandoned:
            raise
        except Exception as exc:  # the statement itself: see _drop
            if len(batch) > 1:  # find the statement it was (halves); keep the rest
                half = len(batch) // 2
                self._commit(batch[:half])
                self._commit(batch[half:])
                return
            self._drop(batch[0], exc)

    def _drop(self, statement: Statement, exc: Exception) -> None:
        """One statement that cannot be written, whatever retries: PostgreSQL
        refuses it (a constraint, a type, a value out of range: SQLSTATE 22,
        23, 42), or psycopg cannot send its values (a lone surrogate). It is
        logged in full and counted; the thread goes on with the rest. Any
        exception counts: a statement must never end the thread that writes
        every later row."""
        self.dropped += 1
        logger.error(
            "ledger: a row cannot be written (%s: %s); dropped: %s",
            type(exc).__name__,
            exc,
            _describe(statement),
        )

    def _retry(self, work: Callable[[_Db], _T], what: str) -> _T:
        """``work(db)`` until PostgreSQL stops refusing it for a reason that may
        pass; a broken connection is replaced first."""
        delay_s, failed_at, logged_at = _FIRST_DELAY_S, 0.0, 0.0
        while True:
            try:
                result = work(self._connection())
            except _REFUSED:
                raise
            except psycopg.Error as exc:
                now = time.monotonic()
                failed_at = failed_at or now
                if now - logged_at >= _LOG_EVERY_S:
                    logged_at = now
                    logger.warning(
                        "ledger %s: could not %s for %.1f s (%s); %d rows wait, "
                        "retrying",
                        *(self.where, what, now - failed_at, exc, self.backlog),
                    )
                self._drop_broken()
                if self._abandon.wait(delay_s):
                    raise _Abandoned from exc
                delay_s = min(delay_s * 2, _MAX_DELAY_S)
                continue
            if failed_at:
                logger.warning(
                    "ledger %s: could %s again after %.1f s",
                    *(self.where, what, time.monotonic() - failed_at),
                )
            return result

    def _connection(self) -> _Db:
        """The open connection, or a new one with the schema made and the lease
        taken before any row goes through it."""
        if self._db is not None:
            return self._db
        db: _Db = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=_CONNECT_TIMEOUT_S,
            application_name="sluicegate-ledger",
        )
        try:
            ensure_schema(db)
            self._renew(db)
        except BaseException:
            db.close()
            raise
        self._db = db
        return db

    def _drop_broken(self) -> None:
        db = self._db
        if db is not None and (db.closed or db.broken):
            self._db = None
            db.close()

    def _renew_if_due(self, db: _Db) -> None:
        if time.monotonic() - self._renewed_at >= self._heartbeat_s:
            self._renew(db)

    def _renew(self, db: _Db) -> None:
        marked = renew(db, self.server_id, self._lease_s)
        self._renewed_at = time.monotonic()
        if marked:
            logger.warning(
                "ledger %s: %d requests of servers whose lease expired marked "
                "truncated",
                *(self.where, marked),
            )

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
                "ledger %s: unreachable for %g s at shutdown; %d statements "
                "logged above instead",
                *(self.where, self._close_timeout_s, lost),
            )


def _transaction(db: _Db, batch: Sequence[Statement]) -> None:
    """``batch`` in one transaction; each run of one statement as one executemany."""
    with db.transaction(), db.cursor() as cursor:
        for sql, run in itertools.groupby(batch, key=lambda s: s[0]):
            cursor.executemany(_psycopg_sql(sql), [params for _, params in run])


@functools.lru_cache(maxsize=64)
def _psycopg_sql(sql: str) -> bytes:
    return translate(sql).encode()


def _describe(statement: Statement) -> str:
    """A statement as one JSON line: its first words and its values, each value
    that is not a plain JSON scalar (or is a long one) by its short ``repr``."""
    sql, params = statement
    return json.dumps({"sql": " ".join(sql.split()[:3]), "params": plain(params)})
