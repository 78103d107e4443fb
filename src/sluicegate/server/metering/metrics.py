"""``/metrics``: the server's Prometheus metrics, one registry per app.

Per request (observed from its ledger row when it ends): time to first token, mean
inter-token latency and total latency histograms; requests by end state and status;
prompt and generated tokens. Requests refused before routing (a missing or wrong
key, a ``Host`` not allowed: ``access.py``; under ``serve``, a request head or body
too late, a head too large, a connection past the cap: ``connections.py``) have no
ledger row; they count in ``sluicegate_refused_requests_total`` by code. Read at
scrape time: active streams, content bytes buffered for slow clients, heartbeats
sent, coalesced events and slow-client aborts (``LiveStreams``); the engine's
queue depth, running sequences, KV cells used and total, and its generated,
wasted and aborted counters (``EngineStats``); resumable streams' producers,
resumes, streams given up and the memory store's bytes (``ResumableStreams``);
the ledger's statements dropped and rows repaired (``Ledger``); those
collectors are ``collectors.py``'s. Under ``serve --workers`` both kinds are
summed over every worker (``render``; ``worker_metrics.py``).

Sampled while the app runs (``Metrics.watch_loop``): how late the event loop runs
a timer, ``sluicegate_event_loop_lag_seconds``. One core runs every stream's
per-token work, so this is where a saturated front end shows first (streams'
inter-token latency rises with it), before any engine metric moves.

Deliberate divergence: inter-token latency is per request, ``(end of the last
token - first token) / (completion tokens - 1)``, not per token, so that a metric
update costs O(1) per request, not per token.

Spec: docs/DESIGN.md, "Metrics"; Prometheus, "Exposition formats" (text 0.0.4).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from sluicegate.core.endstate import EndState
from sluicegate.engines.base import Engine, OutputKind
from sluicegate.engines.clocks import Deadline, Timers
from sluicegate.server.ledger.ledger import LedgerRow
from sluicegate.server.metering.collectors import (
    EngineCollector,
    LedgerCollector,
    LedgerCounts,
    LiveCollector,
    ResumableCollector,
    ResumableCounts,
    UpstreamsCollector,
)
from sluicegate.server.metering.worker_metrics import SummedCollector
from sluicegate.server.streaming.buffer import LiveStreams

__all__ = [
    "CONTENT_TYPE",
    "LOOP_LAG_INTERVAL_S",
    "MULTIPROC_DIR",
    "LoopLag",
    "Metrics",
]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``Content-Type`` of ``Metrics.render()``."""

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_LAG_BUCKETS_S = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)

LOOP_LAG_INTERVAL_S = 0.25
"""Seconds between two event-loop lag samples (four a second: one timer, no task)."""

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"
"""The environment variable naming the folder of prometheus-client's
multiprocess mode, which ``serve --workers`` sets for its workers."""


class Metrics:
    """The metrics of one app.

    Args:
        engine: read (``stats()``) at every scrape.
        live: the app's running responses, read at every scrape.
        engines: every engine the app serves; those with a pool of upstreams
            (``Capabilities.upstreams``) get per-upstream series, labelled by model
            and upstream URL.
    """

    timers: Timers | None = None
    """The clock the loop-lag sampler runs on; ``None``: the running loop."""

    def __init__(
        self, engine: Engine, live: LiveStreams, engines: Sequence[Engine] = ()
    ) -> None:
        self.registry = CollectorRegistry()
        reg = self.registry
        self._ttft = Histogram(
            "sluicegate_time_to_first_token_seconds",
            "From request receipt to the first token id from the engine",
            buckets=_LATENCY_BUCKETS_S,
            registry=reg,
        )
        self._itl = Histogram(
            "sluicegate_inter_token_latency_seconds",
            "Mean time between a request's tokens",
            buckets=_TOKEN_BUCKETS_S,
            registry=reg,
        )
        self._latency = Histogram(
            "sluicegate_request_duration_seconds",
            "From request receipt to its end, whatever the end",
            buckets=_LATENCY_BUCKETS_S,
            registry=reg,
        )
        self._requests = Counter(
            "sluicegate_requests",
            "Requests by end state and HTTP status",
            ["end_state", "status"],
            registry=reg,
        )
        self._tokens = Counter(
            "sluicegate_tokens",
            "Tokens metered by the server (prompt, generated)",
            ["kind"],
            registry=reg,
        )
        self._loop_lag = Histogram(
            "sluicegate_event_loop_lag_seconds",
            "How late the event loop ran a timer (sampled every "
            f"{LOOP_LAG_INTERVAL_S:g} s): the front end's own saturation",
            buckets=_LAG_BUCKETS_S,
            registry=reg,
        )
        self._refused = Counter(
            "sluicegate_refused_requests",
            "Requests refused before routing, by code (a missing or wrong key, "
            "a Host not allowed, a late or oversized request head, a late body, "
            "a connection past the cap); they have no ledger row",
            ["code"],
            registry=reg,
        )
        self._refused_by: dict[str, Counter] = {}
        # Under serve --workers, the series above are kept in files of this
        # folder (prometheus-client picks that at import) and every worker's
        # are summed at a scrape; those read at scrape time are summed over
        # the workers' answers (worker_metrics.py), but for an engine whose
        # stats count every worker's requests already (the engine process).
        self._shared_dir = os.environ.get(MULTIPROC_DIR)
        self._scraped: list[Collector] = []
        self._alone: list[Collector] = []
        self._watch(LiveCollector(live))
        engine_series = EngineCollector(engine)
        if engine.capabilities.shared_stats:
            self.registry.register(engine_series)
            self._alone.append(engine_series)
        else:
            self._watch(engine_series)
        pools = [
            e
            for e in engines
            if e.output_kind is OutputKind.TEXT and e.capabilities.upstreams
        ]
        if pools:
            self._watch(UpstreamsCollector(pools))
        # labels() locks, formats its values and looks the child up on every
        # call; the children are kept here once made. They are still made on
        # first use, as before, so a scrape shows none before its first request.
        self._requests_by: dict[tuple[EndState, int], Counter] = {}
        self._tokens_by: tuple[Counter, Counter] | None = None  # prompt, generated

    def observe(self, row: LedgerRow) -> None:
        """Count one ended request (its ledger row)."""
        key = (row.end_state, row.status)
        requests = self._requests_by.get(key)
        if requests is None:
            requests = self._requests.labels(str(row.end_state), str(row.status))
            self._requests_by[key] = requests
        requests.inc()
        self._latency.observe(max(row.ended_at - row.received_at, 0.0))
        if self._tokens_by is None:
            labels = self._tokens.labels
            self._tokens_by = (labels("prompt"), labels("generated"))
        prompt, generated = self._tokens_by
        prompt.inc(row.prompt_tokens)
        generated.inc(row.completion_tokens)
        if row.first_token_at is None:
            return
        self._ttft.observe(max(row.first_token_at - row.received_at, 0.0))
        if row.completion_tokens > 1:
            span = max(row.ended_at - row.first_token_at, 0.0)
            self._itl.observe(span / (row.completion_tokens - 1))

    def refuse(self, code: str) -> None:
        """Count one request refused before routing (``access.REFUSAL_CODES``,
        ``connections.REFUSAL_CODES``)."""
        refused = self._refused_by.get(code)
        if refused is None:
            refused = self._refused_by[code] = self._refused.labels(code)
        refused.inc()

    def watch_loop(self, interval_s: float = LOOP_LAG_INTERVAL_S) -> LoopLag:
        """Start sampling the lag of ``timers`` (the running loop when ``None``);
        ``stop()`` the result to end.

        Raises:
            RuntimeError: no running event loop.
        """
        timers = self.timers or asyncio.get_running_loop()
        return LoopLag(timers, self._loop_lag.observe, interval_s)

    def watch_resumable(
        self, streams: ResumableCounts, kept_bytes: Callable[[], int] | None
    ) -> None:
        """Export ``streams``'s counts, and the store's bytes when it counts
        them (``kept_bytes``), at every scrape (``sluicegate_resumable_*``)."""
        self._watch(ResumableCollector(streams, kept_bytes))

    def watch_ledger(self, ledger: LedgerCounts) -> None:
        """Export ``ledger``'s write errors and repaired rows at every scrape
        (``sluicegate_ledger_*``)."""
        self._watch(LedgerCollector(ledger))

    def _watch(self, collector: Collector) -> None:
        self.registry.register(collector)
        self._scraped.append(collector)

    def render(self, others: Sequence[bytes] = ()) -> bytes:
        """The text exposition of every metric (``CONTENT_TYPE``).

        Under ``serve --workers`` (``MULTIPROC_DIR``): the per-request series
        summed over every worker's files, and the ones read at scrape time
        summed with ``others`` (the other workers' ``local()``, read now), but
        for an engine whose stats already count every worker's requests.
        """
        if self._shared_dir is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, self._shared_dir)  # type: ignore[no-untyped-call]
        registry.register(SummedCollector(self._scraped, others))
        for collector in self._alone:
            registry.register(collector)
        return generate_latest(registry)

    def local(self) -> bytes:
        """This worker's series read at scrape time that ``render`` sums over
        the workers, as Prometheus text, read now."""
        registry = CollectorRegistry()
        for collector in self._scraped:
            registry.register(collector)
        return generate_latest(registry)


class LoopLag:
    """A timer due every ``interval_s`` seconds that reports how late it ran.

    Each time it runs, ``observe`` gets its lateness in seconds (the loop time
    it ran at minus the time it was due, at least 0; uvloop's clock counts whole
    milliseconds, so about 1 ms reads as noise), then it is due again
    ``interval_s`` later. A loop that is busy with other callbacks, or blocked,
    runs it late by that much.
    """

    def __init__(
        self,
        timers: Timers,
        observe: Callable[[float], None],
        interval_s: float,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._observe = observe
        self._interval_s = interval_s
        self._deadline: Deadline | None = Deadline(timers, interval_s)
        self._deadline.call(self._run)

    def _run(self) -> None:
        deadline = self._deadline
        assert deadline is not None, "stop() cancelled the timer"
        now = deadline.timers.time()
        self._observe(max(now - deadline.when, 0.0))
        self._deadline = Deadline(deadline.timers, self._interval_s)
        self._deadline.call(self._run)

    def stop(self) -> None:
        """No more samples."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
