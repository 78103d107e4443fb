"""The names of the exchanges ``check`` records, and what each one asks.

``check.record`` sends them; the probes look them up by these names. A probe
whose exchanges are missing from a recording answers ``not-observable``.
"""

from __future__ import annotations

__all__ = [
    "AFTER_DISCONNECT",
    "CACHED_PLAIN",
    "CACHED_PRIME",
    "CACHED_STREAM",
    "CONTINUOUS",
    "DISCONNECTED",
    "INVALID",
    "MAX1",
    "MULTIBYTE",
    "MULTIBYTE_PLAIN",
    "N2",
    "NO_USAGE",
    "PLAIN",
    "RESPONSES_RESUMABLE",
    "RESPONSES_RESUME_PAST_END",
    "RESUMABLE",
    "RESUME_PAST_END",
    "SCHEMA",
    "SCHEMA_PLAIN",
    "SLOW_PREFILL",
    "STOP_MANY",
    "STOP_ONE",
    "STREAM",
    "TOOLS",
    "TOOLS_CUT",
    "TOOLS_CUT_PLAIN",
    "TOOLS_PLAIN",
    "TOOLS_SERIAL",
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
TOOLS = "tools"
"""A streamed chat offering one function (``get_weather``) with ``tool_choice``
naming it, temperature 0, ``include_usage``."""
TOOLS_PLAIN = "tools_plain"
"""The ``TOOLS`` request without streaming."""
TOOLS_CUT = "tools_cut"
"""``TOOLS`` with a ``max_tokens`` too small to finish any call."""
TOOLS_CUT_PLAIN = "tools_cut_plain"
"""The ``TOOLS_CUT`` request without streaming."""
SCHEMA = "schema"
"""A streamed chat with a ``json_schema`` ``response_format``, temperature 0."""
SCHEMA_PLAIN = "schema_plain"
"""The ``SCHEMA`` request without streaming."""
CONTINUOUS = "continuous_usage"
"""``STREAM`` with ``stream_options.continuous_usage_stats`` (vLLM's extension)."""
TOOLS_SERIAL = "tools_serial"
"""A streamed chat asking the weather in two cities, one function offered,
``tool_choice: "required"`` and ``parallel_tool_calls: false``."""
SLOW_PREFILL = "slow_prefill"
"""A streamed chat with a long prompt (``--prefill-tokens``) and
``max_tokens: 1``: its time to headers and to first content."""
CACHED_PRIME = "cached_prime"
"""``PLAIN``'s request again with ``max_tokens: 1``, so that a prefix cache
holds its prompt (not graded)."""
CACHED_PLAIN = "cached_plain"
"""The ``CACHED_PRIME`` request again, right after it."""
CACHED_STREAM = "cached_stream"
"""The ``CACHED_PLAIN`` request streamed with ``include_usage``, right after it."""
RESUMABLE = "resumable"
"""``STREAM`` with ``stream_options.resumable`` (sluicegate's resumable streams)."""
RESUME_PAST_END = "resume_past_end"
"""``GET chat/completions/{id}/events`` with ``Last-Event-ID`` at the last event
of the ended ``RESUMABLE`` stream (recorded only when it carried event ids)."""
RESPONSES_RESUMABLE = "responses_resumable"
"""A streamed Responses request with ``store: true`` (a stored response's stream
is resumable)."""
RESPONSES_RESUME_PAST_END = "responses_resume_past_end"
"""``GET responses/{id}?stream=true&starting_after=N`` at the last event's
``sequence_number`` of the ended ``RESPONSES_RESUMABLE`` stream (recorded only
when it answered 200 with a response id and sequence numbers)."""
