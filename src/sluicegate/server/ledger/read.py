"""Reading the SQLite ledger: its ended rows, and its totals per key, from any row.

``read_rows`` gives back the rows as ``LedgerRow`` values (a file no server of
this version has opened yet lacks the newer columns: they read as their
defaults). ``usage_totals`` (``sluicegate usage``) reads any row a ledger file
may hold, whoever wrote it: token sums are exact, however large (SQLite's own
``SUM`` stops at 64 bits, and many rows near that limit would overflow it), and
an end state this version does not know is kept as written.

What a token column may hold that is not a count (SQLite keeps any type in any
column: a file another program wrote) is summed as well as it can be: a REAL by
its integer part, a TEXT of decimal digits by its value; anything else (NULL, a
BLOB, other text, NaN) counts 0. Nothing raises for a row's values.

Spec: docs/DESIGN.md, "Metering"; SQLite, "Datatypes In SQLite",
"Application-Defined SQL Functions" (``create_aggregate``).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from sluicegate.core.endstate import EndState
from sluicegate.core.events import FinishReason
from sluicegate.server.ledger.file import OPEN, connect
from sluicegate.server.ledger.rows import NAMES, LedgerRow, UsageTotal

__all__ = ["picked_rows", "read_rows", "row_of", "total_of", "usage_totals"]

_DIGITS = re.compile(r"[+-]?[0-9]{1,64}", re.ASCII)
_STATES = frozenset(state.value for state in EndState)


def read_rows(
    path: Path, *, newest: int | None = None, request_id: str | None = None
) -> list[LedgerRow]:
    """Every ended row of the ledger file at ``path``, in order of end.

    Rows still ``open`` (their requests run) are left out; the rows a dead
    server left open are here once a server has opened the file since.

    Args:
        newest: only the last ``newest`` rows to end (still oldest first).
        request_id: only that request's row.

    Raises:
        sqlite3.Error: not a ledger file.
    """
    db = connect(path)
    try:
        # A file no server of this version has opened yet lacks the newer
        # columns: read them as their defaults.
        present = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
        columns = ", ".join(n if n in present else "0" for n in NAMES)
        where, params = picked_rows(newest, request_id)
        cursor = db.execute(f"SELECT {columns} FROM requests {where}", params)
        rows = [row_of(values) for values in cursor]
        return rows if newest is None else rows[::-1]
    finally:
        db.close()


def picked_rows(
    newest: int | None, request_id: str | None, mark: str = "?"
) -> tuple[str, tuple[object, ...]]:
    """The ``WHERE`` and ``ORDER BY`` of ``read_rows`` and its parameters
    (``mark``: the driver's placeholder; PostgreSQL's is ``%s``)."""
    where = f"WHERE end_state != '{OPEN}'"
    params: tuple[object, ...] = ()
    if request_id is not None:
        where += f" AND request_id = {mark}"
        params = (request_id,)
    if newest is None:
        return where + " ORDER BY ended_at", params
    return where + f" ORDER BY ended_at DESC LIMIT {mark}", (*params, newest)


def row_of(values: tuple[object, ...]) -> LedgerRow:
    """The ``LedgerRow`` of one table row's ``NAMES`` columns, in that order.

    Raises:
        ValueError: a value this version does not know (an end state, a finish
            reason, a count that is not a number).
    """
    (rid, key_id, endpoint, model, status, state, prompt, completion) = values[:8]
    reasons, received, first, ended, estimated, resumed, reasoning = values[8:]
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
        usage_estimated=bool(estimated),
        resumed=int(str(resumed)),
        reasoning_tokens=int(str(reasoning)),
    )


class _ExactSum:
    """SQLite aggregate: the exact sum of a token column, as decimal text (an
    application-defined function cannot return an integer past 64 bits)."""

    def __init__(self) -> None:
        self.total = 0

    def step(self, value: object) -> None:
        # Must not raise: SQLite would end the whole query with an error.
        if isinstance(value, int):
            self.total += value
        elif isinstance(value, float):
            if math.isfinite(value):
                self.total += int(value)
        elif isinstance(value, str) and _DIGITS.fullmatch(value.strip()):
            self.total += int(value)

    def finalize(self) -> str:
        return str(self.total)


def usage_totals(path: Path) -> list[UsageTotal]:
    """Requests and tokens per (key id, end state), sorted by key then state,
    from whatever rows the file holds (see the module doc).

    Requests still running are counted under ``OPEN``.

    Raises:
        sqlite3.Error: not a ledger file.
    """
    db = connect(path)
    try:
        # typeshed has finalize return an int; SQLite takes text as well.
        db.create_aggregate("exact_sum", 1, _ExactSum)  # type: ignore[arg-type]
        # A file of a release before the column (never migrated) counts 0.
        present = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
        reasoning = "reasoning_tokens" if "reasoning_tokens" in present else "0"
        cursor = db.execute(
            "SELECT key_id, end_state, COUNT(*), exact_sum(prompt_tokens), "
            f"exact_sum(completion_tokens), exact_sum({reasoning}) FROM requests "
            "GROUP BY key_id, end_state ORDER BY key_id, end_state"
        )
        return [total_of(*values) for values in cursor]
    finally:
        db.close()


def total_of(
    key_id: object,
    state: object,
    requests: object,
    prompt: object,
    completion: object,
    reasoning: object = 0,
) -> UsageTotal:
    """One ``UsageTotal`` from a totals query's row: counts as ints (from an int,
    a ``Decimal`` or decimal text), an unknown end state as its text."""
    text = str(state)
    end_state = EndState(text) if text in _STATES else text
    return UsageTotal(
        str(key_id),
        end_state,
        int(str(requests)),
        int(str(prompt)),
        int(str(completion)),
        int(str(reasoning)),
    )
