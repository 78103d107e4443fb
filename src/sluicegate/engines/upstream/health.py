"""The upstream engine's active health checks: each upstream's health path, polled.

Every ``interval_s`` seconds on its clock (``timers``: the event loop, or a
``ManualClock`` a test steps), ``check_health`` GETs the ``health_path`` of each
upstream that has one (at once, each within its connect time limit, 5 s when it
has none) and reports a 2xx as healthy, any other status or a failed hop as
not, to the pool (``UpstreamPool.report_health``), until it is cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.engines.upstream.config import UpstreamConfig
from sluicegate.engines.upstream.http import HopClient, HopError
from sluicegate.engines.upstream.pool import UpstreamPool

__all__ = ["check_health"]


async def check_health(
    pool: UpstreamPool,
    upstreams: Sequence[UpstreamConfig],
    clients: Sequence[HopClient],
    interval_s: float,
    timers: Timers,
) -> None:
    """Probe every upstream, then again ``interval_s`` seconds (on ``timers``)
    after each round ended, until cancelled."""
    while True:
        results = await asyncio.gather(
            *(_probe(upstreams[i], clients[i]) for i in range(len(upstreams)))
        )
        for i, ok in enumerate(results):
            if ok is not None:
                pool.report_health(i, ok)
        await Deadline(timers, interval_s).passed()


async def _probe(upstream: UpstreamConfig, client: HopClient) -> bool | None:
    if not upstream.health_path:
        return None
    timeout = upstream.timeouts.connect_s or 5.0
    try:
        status = await client.get_status(upstream.health_path, timeout)
    except HopError:
        return False
    return 200 <= status < 300
