"""The PostgreSQL ledger's writer: the writer thread over a PostgreSQL backend.

``PgLedgerWriter`` is ``WriterThread`` (``thread.py``: the queue,
batches, retries, drops, as for the SQLite ``LedgerWriter``) writing through
``PgBackend``, for a database that many replicas share: the same statements
(``Ledger`` builds them; ``?`` placeholders become psycopg's ``%s``), one
psycopg connection of its own. A batch is one transaction (runs of one
statement as one ``executemany``, pipelined), retried while PostgreSQL is
unreachable, restarting, or refuses for a reason that may pass, reconnecting as
needed. A statement PostgreSQL refuses for its own data or text (a constraint,
a type, a number out of range), or whose values psycopg cannot send, is
dropped alone and logged.

Invariants:
    - Before any row, and again on every reconnection: the schema is created
      or completed, and this writer's lease taken (``pg_schema.py``).
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
import logging
import uuid
from collections.abc import Sequence

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - psycopg is in the dev set
    raise ImportError(
        "a PostgreSQL ledger needs psycopg: pip install 'sluicegate[postgres]'"
    ) from exc

from sluicegate.engines.clocks import Timers
from sluicegate.server.ledger.file import Statement
from sluicegate.server.ledger.pg_schema import (
    ensure_schema,
    redact,
    release,
    renew,
    translate,
)
from sluicegate.server.ledger.thread import Retry, WriterThread

__all__ = ["PgBackend", "PgLedgerWriter"]

logger = logging.getLogger(__name__)

_Db = psycopg.Connection[tuple[object, ...]]
_CONNECT_TIMEOUT_S = 5


class PgLedgerWriter(WriterThread):
    """Commits statements to the ledger at ``url``, in order, from one thread.

    Args:
        url: a libpq URL (``postgresql://user:password@host:port/database``).
        close_timeout_s: how long ``close`` waits for the database (seconds).
        lease_s: how long this server counts as alive after its last renewal
            (seconds, > 0); its open rows are marked ``truncated`` once it
            expires.
        heartbeat_interval_s: seconds between renewals; default: a third of
            ``lease_s``, 1 s at most.
        timers: the clock of the thread's waits and heartbeat (default:
            ``ThreadTimers``; a test steps a ``ManualClock``).

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
        timers: Timers | None = None,
    ) -> None:
        server_id = uuid.uuid4().hex
        backend = PgBackend(url, server_id, lease_s, heartbeat_interval_s)
        self.url = url
        self.where = backend.where
        super().__init__(
            backend,
            server_id,
            close_timeout_s,
            name="ledger-writer postgresql",
            timers=timers,
        )


class PgBackend:
    """A PostgreSQL ledger as a ``LedgerBackend``: one connection, made on first
    use and again after it broke, and this server's lease, renewed at each
    heartbeat.

    Args: as ``PgLedgerWriter``'s, and ``server_id``, the id its lease is under.

    Raises:
        ValueError: ``url`` is not a libpq URL, or ``lease_s`` is not > 0.
    """

    away = "unreachable"
    max_batch = 1000
    transient: type[Exception] = psycopg.Error
    refused: tuple[type[Exception], ...] = (
        psycopg.IntegrityError,
        psycopg.DataError,
        psycopg.ProgrammingError,
    )
    """What PostgreSQL (or psycopg) says about the statement itself: retrying
    cannot help (SQLSTATE classes 22, 23 and 42)."""

    def __init__(
        self,
        url: str,
        server_id: str,
        lease_s: float,
        heartbeat_interval_s: float | None,
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s!r}")
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"expected a PostgreSQL URL, got {redact(url)!r}") from exc
        self.url = url
        self.where = redact(url)
        self._server_id = server_id
        self._lease_s = lease_s
        self.heartbeat_s: float | None = heartbeat_interval_s or min(1.0, lease_s / 3)
        self._db: _Db | None = None

    def start(self, retry: Retry) -> None:
        """Nothing before the first batch: the first ``beat`` connects and
        takes the lease."""

    def beat(self, retry: Retry) -> None:
        """Renew the lease (connecting first when there is no connection: a
        new one takes it) and mark the rows of servers whose lease expired."""
        retry(self._renew_lease, "renew the lease")

    def write(self, batch: Sequence[Statement]) -> None:
        """``batch`` in one transaction; each run of one statement as one
        executemany."""
        db = self._connection()
        with db.transaction(), db.cursor() as cursor:
            for sql, run in itertools.groupby(batch, key=lambda s: s[0]):
                cursor.executemany(_psycopg_sql(sql), [params for _, params in run])

    def recover(self) -> None:
        """Drop a broken connection: the next try makes a new one."""
        db = self._db
        if db is not None and (db.closed or db.broken):
            self._db = None
            db.close()

    def close(self) -> None:
        """Give the lease back and close the connection."""
        db, self._db = self._db, None
        if db is not None:
            with contextlib.suppress(psycopg.Error):
                release(db, self._server_id)
            db.close()

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

    def _renew_lease(self) -> None:
        if self._db is None:
            self._connection()
        else:
            self._renew(self._db)

    def _renew(self, db: _Db) -> None:
        marked = renew(db, self._server_id, self._lease_s)
        if marked:
            logger.warning(
                "ledger %s: %d requests of servers whose lease expired marked "
                "truncated",
                *(self.where, marked),
            )


@functools.lru_cache(maxsize=64)
def _psycopg_sql(sql: str) -> bytes:
    return translate(sql).encode()
