"""What a ledger row may hold: every value made storable before it is written.

A ledger row's values come from the request, the engine and, behind
``--upstream``, from another server's usage numbers: untrusted. ``repair`` takes
a row's fields and returns the ones that SQLite and PostgreSQL cannot store (or
that would break the writer's thread) replaced by the nearest value they can,
with one line per repair saying what was seen; ``Ledger`` writes the repaired
row and logs and counts the repairs (``sluicegate_ledger_repaired_rows_total``).

The rules, per column type of ``file.py``'s table:

- INTEGER (``status``, ``prompt_tokens``, ``completion_tokens``, ``resumed``,
  ``reasoning_tokens``):
  an ``int`` from 0 to ``MAX_COUNT`` (SQLite's INTEGER and PostgreSQL's
  ``bigint`` are signed 64-bit). Past it: ``MAX_COUNT``; below 0: 0; a finite
  ``float``: its integer part, clamped so; NaN, anything else: 0.
- REAL (``received_at``, ``ended_at``; ``first_token_at`` may be ``None``): a
  finite float (an int a float holds exactly is kept; a larger one within
  1e18 s becomes a float). NaN, an infinity, anything else: the time of the
  repair (``first_token_at``: ``None``).
- TEXT (``request_id``, ``key_id``, ``endpoint``; ``model`` may be ``None``):
  a ``str`` of at most ``MAX_TEXT_CHARS`` code points (longer: cut), without NUL
  (PostgreSQL's ``text`` refuses it: each becomes U+FFFD) and without lone
  surrogates (neither database can encode them: U+FFFD too). Anything else:
  its short ``repr`` (``describe``), repaired so.

Invariants:
    - ``repair`` never raises on a value of any type a row is built from
      (``int``, ``float``, ``str``, ``None``, and their subclasses), and
      changes nothing on a row that is storable as it is.
    - A repaired row's token counts are no longer the engine's: ``Ledger``
      marks it ``usage_estimated``.

Spec: SQLite, "Datatypes In SQLite" (INTEGER: 8 bytes signed); PostgreSQL,
"Numeric Types" (``bigint``), "Character Types" (no NUL in ``text``).
"""

from __future__ import annotations

import math
import re
import reprlib
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "COUNTS",
    "MAX_COUNT",
    "MAX_TEXT_CHARS",
    "TEXTS",
    "TIMES",
    "count",
    "describe",
    "plain",
    "repair",
    "when",
]

MAX_COUNT: Final = 2**63 - 1
"""The largest count a ledger column holds (signed 64-bit)."""

MAX_TEXT_CHARS: Final = 1024
"""The longest text a ledger column keeps, in code points (ids, key ids, paths
and model names are far shorter; this bounds a row whatever reaches it)."""

COUNTS: Final = (
    "status",
    "prompt_tokens",
    "completion_tokens",
    "resumed",
    "reasoning_tokens",
)
"""The integer fields of a row."""
TIMES: Final = ("received_at", "first_token_at", "ended_at")
"""The Unix-time fields of a row (``first_token_at`` may be ``None``)."""
TEXTS: Final = ("request_id", "key_id", "endpoint", "model")
"""The text fields of a row (``model`` may be ``None``)."""
_NULLABLE: Final = frozenset(("first_token_at", "model"))
_DESCRIBE_CHARS: Final = 64  # of a value quoted in a log line
_DESCRIBE_BITS: Final = 128  # an int past it is described by its size
_EXACT_SECONDS: Final = 2**53  # an int time this small is a float exactly
_FAR_S: Final = 1e18  # seconds: no time in a row is this far from 1970
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_REPR: Final = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = _DESCRIBE_CHARS


def count(value: object) -> int:
    """``value`` as a count a ledger column holds: an int from 0 to ``MAX_COUNT``
    (see the module doc); never raises."""
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return min(max(int(value), 0), MAX_COUNT)
    return 0


def repair(fields: Mapping[str, object]) -> tuple[dict[str, Any], list[str]]:
    """The fields of a row that must change before it is written, and why.

    Args:
        fields: field name to value, for any of ``COUNTS``, ``TIMES`` and
            ``TEXTS`` (other names are left alone).

    Returns:
        ``(changed, problems)``: each field whose value cannot be stored, with
        the value to store instead, and one line per change naming the field,
        the value seen and the value stored (each cut to a few dozen
        characters). Both empty for a storable row.
    """
    changed: dict[str, Any] = {}
    problems: list[str] = []
    for name, value in fields.items():
        if name in COUNTS:
            fixed: object = count(value)
            ok = type(value) is int and fixed == value
        elif name in TIMES:
            fixed = when(value)
            if fixed is None and name not in _NULLABLE:
                fixed = time.time()
            ok = fixed is value
        elif name in TEXTS:
            fixed = _text(value, name in _NULLABLE)
            ok = fixed is value
        else:
            continue
        if not ok:
            changed[name] = fixed
            problems.append(f"{name} {describe(value)} written as {describe(fixed)}")
    return changed, problems


def when(value: object) -> float | int | None:
    """``value`` as a time a ledger column holds: ``value`` itself when it is a
    finite float or an int a float holds exactly, else a finite float near it
    (within 1e18 s), else ``None``; never raises."""
    if (type(value) is float and math.isfinite(value)) or (
        type(value) is int and abs(value) <= _EXACT_SECONDS
    ):
        return value
    if isinstance(value, int | float) and -_FAR_S < value < _FAR_S:  # not NaN
        return float(value)
    return None


def _text(value: object, nullable: bool) -> object:
    if value is None and nullable:
        return value
    text = value if type(value) is str else describe(value)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS]
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if not text.isascii():
        text = _SURROGATE.sub("\ufffd", text)  # lone: neither database encodes them
    return value if text == value and type(value) is str else text


def plain(values: Iterable[object]) -> list[object]:
    """``values`` for a JSON log line: ``None``, bools, ints within 64 bits,
    finite floats and strings of up to ``MAX_TEXT_CHARS`` as they are, any
    other value as its ``describe`` text; never raises."""
    kept: list[object] = []
    for value in values:
        if (
            value is None
            or isinstance(value, bool)
            or (isinstance(value, int) and value.bit_length() <= 63)
            or (isinstance(value, float) and math.isfinite(value))
            or (isinstance(value, str) and len(value) <= MAX_TEXT_CHARS)
        ):
            kept.append(value)
        else:
            kept.append(describe(value))
    return kept


def describe(value: object) -> str:
    """``value`` for a log line: short, and never raising on a value of the
    types a row holds (an int of thousands of digits, a huge string)."""
    if isinstance(value, int) and value.bit_length() > _DESCRIBE_BITS:
        return f"<an integer of {value.bit_length()} bits>"
    return _REPR.repr(value)
