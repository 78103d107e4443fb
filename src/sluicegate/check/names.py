"""The names of the exchanges ``check`` records, and what each one asks.

``check.record`` sends them; the probes look them up by these names. A probe
whose exchanges are missing from a recording answers ``not-observable``.
"""

from __future__ import annotations

__all__ = [
    "AFTER_DISCONNECT",
    "DISCONNECTED",
    "INVALID",
    "MAX1",
    "MULTIBYTE",
    "MULTIBYTE_PLAIN",
    "N2",
    "NO_USAGE",
    "PLAIN",
    "STOP_MANY",
    "STOP_ONE",
    "STREAM",
]

STREAM = "stream"
"""Chat, streamed, temperature 0, ``include_usage``."""
PLAIN = "plain"
"""The ``STREAM`` request without streaming (the reference text and usage)."""
NO_USAGE = "stream_no_usage"
"""The ``STREAM`` request without ``stream_options``."""
MULTIBYTE = "multibyte"
"""A streamed answer likely to hold multi-byte characters (emoji, CJK)."""
MULTIBYTE_PLAIN = "multibyte_plain"
"""The ``MULTIBYTE`` request without streaming."""
STOP_ONE = "stop_one"
"""``STREAM`` with one stop string cut from the middle of ``PLAIN``'s text."""
STOP_MANY = "stop_many"
"""``STREAM`` with several stop strings, one of which occurs in ``PLAIN``."""
MAX1 = "max_tokens_1"
"""``STREAM`` with ``max_tokens: 1``."""
N2 = "n2"
"""``STREAM`` with ``n: 2`` (temperature 1, so the choices may differ)."""
INVALID = "invalid"
"""A streamed request with an invalid ``max_tokens`` (prefix: several kinds)."""
DISCONNECTED = "disconnected"
"""A long streamed answer the recorder closes after its first text."""
AFTER_DISCONNECT = "after_disconnect"
"""``STREAM`` sent right after ``DISCONNECTED`` was closed."""
