"""Reading the PostgreSQL ledger: its ended rows and its totals per key.

The twins of ``ledger_read.read_rows`` and ``ledger_read.usage_totals`` for a
ledger URL: the same queries, rows and totals, so ``sluicegate usage`` prints the
same table over a file or a database that hold the same rows. Sums are exact
(``numeric``), and an end state this version does not know is kept as written.
The schema is made first if missing (an empty ledger reads as empty, as a new
SQLite file does).

Spec: docs/DESIGN.md, "Metering"; libpq, "Connection URIs".
"""

from __future__ import annotations

import psycopg

from sluicegate.server.ledger.pg_schema import ensure_schema
from sluicegate.server.ledger.read import picked_rows, row_of, total_of
from sluicegate.server.ledger.rows import NAMES, LedgerRow, UsageTotal

__all__ = ["read_rows", "usage_totals"]

_CONNECT_TIMEOUT_S = 10


def _connect(url: str) -> psycopg.Connection[tuple[object, ...]]:
    db: psycopg.Connection[tuple[object, ...]] = psycopg.connect(
        url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S
    )
    try:
        ensure_schema(db)
    except BaseException:
        db.close()
        raise
    return db


def read_rows(
    url: str, *, newest: int | None = None, request_id: str | None = None
) -> list[LedgerRow]:
    """Every ended row of the ledger at ``url``, in order of end.

    Rows still ``open`` are left out; those of a server whose lease expired are
    here once a live replica has marked them ``truncated``.

    Args:
        newest: only the last ``newest`` rows to end (still oldest first).
        request_id: only that request's row.

    Raises:
        psycopg.Error: the database cannot be reached or read.
    """
    with _connect(url) as db:
        where, params = picked_rows(newest, request_id, "%s")
        query = f"SELECT {', '.join(NAMES)} FROM requests {where}"
        rows = [row_of(values) for values in db.execute(query, params)]
        return rows if newest is None else rows[::-1]


def usage_totals(url: str) -> list[UsageTotal]:
    """Requests and tokens per (key id, end state), sorted by key then state.

    Requests still running are counted under ``OPEN``.

    Raises:
        psycopg.Error: the database cannot be reached or read.
    """
    with _connect(url) as db:
        cursor = db.execute(
            # SUM of bigint is numeric in PostgreSQL: exact, however many rows
            # near 64 bits it adds. COLLATE "C" sorts by code point, as SQLite
            # does.
            "SELECT key_id, end_state, COUNT(*), SUM(prompt_tokens), "
            "SUM(completion_tokens), SUM(reasoning_tokens) FROM requests "
            "GROUP BY key_id, end_state "
            'ORDER BY key_id COLLATE "C", end_state COLLATE "C"'
        )
        return [total_of(*values) for values in cursor]
