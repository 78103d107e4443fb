"""The upstream engine's time limits: one timer per sequence, never one per chunk.

Each sequence has at most one loop timer, due at the earliest of its limits
that applies now: the total time, the time to first token (before the first
content), the idle time since the last item (after it). It is re-armed when it
fires early and at the first token (``arm``); when a limit ran out it records
which in ``UpstreamSequence.timed_out`` and cancels the sequence's task.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.sequence import UpstreamSequence

__all__ = ["arm"]


def arm(seq: UpstreamSequence, upstreams: Sequence[UpstreamConfig]) -> None:
    """Start ``seq``'s timer for the earliest limit that applies now, if any."""
    limits = (
        upstreams[0].timeouts
        if seq.lease is None
        else (upstreams[seq.lease.member].timeouts)
    )
    deadlines = [(math.inf, "")]
    if limits.total_s is not None:
        deadlines.append((seq.started + limits.total_s, "total time limit"))
    if seq.first_at is None:
        if limits.first_token_s is not None:
            due = seq.started + limits.first_token_s
            deadlines.append((due, "time to first token limit"))
    elif limits.idle_s is not None:
        deadlines.append((seq.last_at + limits.idle_s, "idle time limit"))
    due, _ = min(deadlines)
    if due < math.inf:
        seq.timer = asyncio.get_running_loop().call_at(due, _check, seq, upstreams)


def _check(seq: UpstreamSequence, upstreams: Sequence[UpstreamConfig]) -> None:
    seq.timer = None
    task = seq.task
    if task is None or task.done():
        return
    now = asyncio.get_running_loop().time()
    limits = upstreams[0 if seq.lease is None else seq.lease.member].timeouts
    for limit, since, name in (
        (limits.total_s, seq.started, "total time limit"),
        (
            limits.first_token_s if seq.first_at is None else None,
            seq.started,
            "time to first token limit",
        ),
        (
            limits.idle_s if seq.first_at is not None else None,
            seq.last_at,
            "idle time limit",
        ),
    ):
        if limit is not None and now >= since + limit:
            seq.timed_out = name
            task.cancel()
            return
    arm(seq, upstreams)
