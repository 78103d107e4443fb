"""``sluicegate doctor --upstream URL``: can this machine reach its upstreams?

For each upstream (an OpenAI-compatible API base, as ``serve --upstream``
takes it) it prints the listing URL without secrets (``redact_url``), the
models listed at ``GET {url}/models`` and the time the whole check took, or why
there is no list: no answer, a status (never the upstream's words), a list that
is not one, or none within the deadline (the same one discovery at start-up
has, ``list_models``). Redirects are not followed.

A base that answered 404 without ``/v1`` at the end of its path, or that has
no scheme, most likely lacks them (``--upstream 10.0.0.5:8000``): the same
base with them is asked too (``list_models``, as discovery at start-up does),
and the line says what to pass instead when it lists models (``use --upstream
http://10.0.0.5:8000/v1``), or what it answered.

Exit codes: 0 every upstream listed at least one model; 1 otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO

import httpx

from sluicegate.engines.upstream.file import list_models

__all__ = ["UPSTREAM_DEADLINE_S", "diagnose_upstreams"]

UPSTREAM_DEADLINE_S = 10.0
"""The deadline of the whole check (seconds)."""


def diagnose_upstreams(
    urls: Sequence[str],
    out: TextIO,
    timeout_s: float = UPSTREAM_DEADLINE_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> int:
    """Print each upstream's reachability and model list on ``out``.

    Args:
        urls: API bases, e.g. ``http://10.0.0.5:8000/v1`` (>= 1).
        out: where the report goes (one line per upstream, then a verdict).
        timeout_s: the deadline of the whole check (seconds).
        transport: an httpx transport instead of the network (tests).

    Returns:
        0 when every upstream listed a model, else 1.
    """
    started = time.monotonic()
    results = list_models(urls, timeout_s, transport)
    elapsed = time.monotonic() - started
    failed = 0
    for listing, ids in results:
        if isinstance(ids, str) or not ids:
            failed += 1
            why = ids if isinstance(ids, str) else "lists no model"
            out.write(f"upstream {listing}: error: {why}\n")
        else:
            shown = ", ".join(map(repr, ids[:20])) + (" ..." if len(ids) > 20 else "")
            out.write(f"upstream {listing}: {len(ids)} models: {shown}\n")
    out.write(f"upstreams: checked in {elapsed:.2f} s\n")
    if failed:
        out.write(f"doctor: {failed} of {len(results)} upstreams unusable\n")
        return 1
    out.write("doctor: upstreams ok\n")
    return 0
