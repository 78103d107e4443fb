"""The ledger in PostgreSQL: its tables, the replicas' leases, and ledger URLs.

The ``requests`` table has the SQLite ledger's columns, names and types, read
from SQLite's own schema (``file.py``) rather than written twice: TEXT is
``text``, INTEGER (64-bit in SQLite) ``bigint``, REAL (8-byte) ``double
precision``. ``ensure_schema`` creates what is missing and adds the columns a
table of an older release lacks, under an advisory lock, so replicas that start
together do not race on ``CREATE TABLE``.

Replicas and their leases: ``ledger_replicas`` holds one row per running
writer, ``(server_id, started_at, lease_until)``, in the database's clock (Unix
seconds), so the replicas' own clocks never need to agree. A writer renews its
lease (``renew``) every ``heartbeat_interval_s``; in the same transaction it
marks ``truncated`` the ``open`` rows of every server without a lease in force
(expired: killed, or cut off from the database past its lease), and deletes
the expired leases. A writer that stops cleanly gives its lease back
(``release``), so its rows still open are marked at once.

Deliberate divergence from the SQLite ledger, which marks at start only: here a
surviving replica marks a dead one's rows within ``lease_s`` plus one heartbeat,
without waiting for a restart. A live replica cut off from the database longer
than its lease has its open rows marked too; when it is back its lease is
renewed, and the requests that then end overwrite ``truncated`` with their real
end (``Ledger.record`` is an upsert).

Spec: PostgreSQL, "CREATE TABLE", "ALTER TABLE ... ADD COLUMN IF NOT EXISTS",
"Advisory Locks", "INSERT ... ON CONFLICT"; libpq, "Connection URIs".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit, urlunsplit

from sluicegate.server.ledger.file import OPEN, connect, migrate

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "SCHEMES",
    "columns",
    "ensure_schema",
    "is_url",
    "redact",
    "release",
    "renew",
    "translate",
]

SCHEMES: Final = ("postgresql://", "postgres://")
"""How a PostgreSQL ledger URL starts (libpq's two URI schemes)."""

_TYPES: Final = {"TEXT": "text", "INTEGER": "bigint", "REAL": "double precision"}
_SCHEMA_LOCK: Final = 0x5E1CE6A7E
"""The advisory lock key held while the schema is made (any constant)."""
_NOW: Final = "extract(epoch from clock_timestamp())"

_REPLICAS = """
CREATE TABLE IF NOT EXISTS ledger_replicas (
    server_id text PRIMARY KEY,
    started_at double precision NOT NULL,
    lease_until double precision NOT NULL
)
"""
_OPEN_INDEX = (
    "CREATE INDEX IF NOT EXISTS requests_open ON requests (server_id) "
    f"WHERE end_state = '{OPEN}'"
)
_RENEW = (
    "INSERT INTO ledger_replicas (server_id, started_at, lease_until) "
    f"VALUES (%s, {_NOW}, {_NOW} + %s) ON CONFLICT (server_id) "
    "DO UPDATE SET lease_until = excluded.lease_until"
)
_MARK = (
    "UPDATE requests SET end_state = 'truncated' "
    f"WHERE end_state = '{OPEN}' AND (server_id IS NULL OR server_id NOT IN "
    f"(SELECT server_id FROM ledger_replicas WHERE lease_until >= {_NOW}))"
)
_EXPIRE = f"DELETE FROM ledger_replicas WHERE lease_until < {_NOW}"


def is_url(target: str) -> bool:
    """Whether ``target`` (a ``--ledger`` value) names PostgreSQL, not a file."""
    return target.startswith(SCHEMES)


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``, for logs and titles."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc))


def translate(sql: str) -> str:
    """An SQLite statement (``?`` placeholders) as psycopg takes it (``%s``).

    The ledger's statements have no ``?`` or ``%`` inside a string literal.
    """
    return sql.replace("%", "%%").replace("?", "%s")


def columns() -> list[tuple[str, str, bool, str | None]]:
    """The SQLite ledger's columns as PostgreSQL ones, in SQLite's order.

    Returns:
        ``(name, PostgreSQL type, not null, default SQL or None)`` per column.

    Raises:
        ValueError: SQLite's schema has a type this module does not map.
    """
    db = connect(Path(":memory:"))
    try:
        migrate(db)
        info = db.execute("PRAGMA table_info(requests)").fetchall()
    finally:
        db.close()
    result = []
    for _, name, kind, not_null, default, _ in info:
        if kind not in _TYPES:
            raise ValueError(
                f"expected a column type in {sorted(_TYPES)}, got {kind!r}"
            )
        result.append((str(name), _TYPES[kind], bool(not_null), default))
    return result


def _definition(name: str, kind: str, not_null: bool, default: str | None) -> str:
    clause = f"{name} {kind}"
    if not_null:
        clause += " NOT NULL"
    if default is not None:
        clause += f" DEFAULT {default}"
    return clause


def ensure_schema(db: psycopg.Connection[tuple[object, ...]]) -> None:
    """Create the tables and index if missing, add missing columns; one transaction.

    Raises:
        psycopg.Error: what PostgreSQL raised; nothing is changed then.
    """
    cols = columns()
    primary = cols[0][0]
    body = ", ".join(
        _definition(*c) + (" PRIMARY KEY" if c[0] == primary else "") for c in cols
    )
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        db.execute(f"CREATE TABLE IF NOT EXISTS requests ({body})")
        for column in cols[1:]:
            db.execute(
                f"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {_definition(*column)}"
            )
        db.execute(_OPEN_INDEX)
        db.execute(_REPLICAS)


def renew(
    db: psycopg.Connection[tuple[object, ...]], server_id: str, lease_s: float
) -> int:
    """Renew this writer's lease; mark the open rows of servers without one.

    Returns:
        How many rows were marked ``truncated``.

    Raises:
        psycopg.Error: what PostgreSQL raised; nothing is changed then.
    """
    with db.transaction():
        db.execute(_RENEW, (server_id, lease_s))
        marked = db.execute(_MARK).rowcount
        db.execute(_EXPIRE)
    return max(marked, 0)


def release(db: psycopg.Connection[tuple[object, ...]], server_id: str) -> None:
    """Give this writer's lease back (its rows still open are then marked)."""
    with db.transaction():
        db.execute("DELETE FROM ledger_replicas WHERE server_id = %s", (server_id,))
