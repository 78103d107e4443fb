"""The series ``/metrics`` reads at scrape time: engines, live streams, stores, ledger.

Each collector reads its source when Prometheus scrapes, not per request: the
app's ``LiveStreams`` (``LiveCollector``), the engine's ``EngineStats``
(``EngineCollector``), the resumable streams and the memory store's bytes
(``ResumableCollector``), the ledger's dropped statements and repaired rows
(``LedgerCollector``), and the per-upstream series of engines that serve from
a pool (``UpstreamsCollector``).
``metrics.Metrics`` registers them.

Spec: docs/DESIGN.md, "Metrics"; Prometheus, "Exposition formats" (text 0.0.4).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from sluicegate.engines.base import Engine, TextEngine
from sluicegate.server.streaming.buffer import LiveStreams

__all__ = [
    "EngineCollector",
    "LedgerCollector",
    "LedgerCounts",
    "LiveCollector",
    "ResumableCollector",
    "ResumableCounts",
    "UpstreamsCollector",
]


class LiveCollector(Collector):
    """Gauges and counters read from the app's live streams per scrape."""

    def __init__(self, live: LiveStreams) -> None:
        self._live = live

    def collect(self) -> Iterator[Metric]:
        live = self._live
        yield GaugeMetricFamily(
            "sluicegate_active_streams", "Responses now running", value=len(live)
        )
        yield GaugeMetricFamily(
            "sluicegate_stream_buffer_bytes",
            "Bytes waiting for slow clients (content plus per-event cost)",
            value=live.pending_bytes,
        )
        counters = {
            "heartbeats_sent": ("Keep-alive comments written", live.heartbeats_sent),
            "coalesced_events": ("Deltas merged into others", live.coalesced_events),
            "slow_client_aborts": ("Streams aborted: slow client", live.aborted_slow),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"sluicegate_{name}", doc, value=value)


class EngineCollector(Collector):
    """Gauges and counters read from the engine's stats per scrape."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        gauges = {
            "engine_queue_depth": ("Requests queued", stats.queued),
            "engine_running": ("Sequences running", stats.running),
            "kv_cells_used": ("KV cells (tokens) in use", stats.kv_cells_used),
            "kv_cells_total": ("KV cells (tokens) in all", stats.kv_cells_total),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"sluicegate_{name}", doc, value=value)
        counters = {
            "engine_generated_tokens": ("Engine tokens", stats.generated_tokens),
            "engine_wasted_tokens": ("Tokens after an abort", stats.wasted_tokens),
            "engine_aborted_requests": ("Engine aborts", stats.aborted_requests),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"sluicegate_{name}", doc, value=value)


class ResumableCounts(Protocol):
    """What ``Metrics.watch_resumable`` reads per scrape (``ResumableStreams``)."""

    @property
    def producing(self) -> int: ...

    resumes: int
    given_up: int


class ResumableCollector(Collector):
    """Resumable streams, read per scrape: producers running here, resumes
    answered, streams given up, and the store's bytes where it keeps a count
    (the memory store; a shared store's are Redis's own metrics)."""

    def __init__(
        self, streams: ResumableCounts, kept_bytes: Callable[[], int] | None
    ) -> None:
        self._streams = streams
        self._kept_bytes = kept_bytes

    def collect(self) -> Iterator[Metric]:
        streams = self._streams
        yield GaugeMetricFamily(
            "sluicegate_resumable_producers",
            "Resumable streams whose producer runs on this server",
            value=streams.producing,
        )
        if self._kept_bytes is not None:
            yield GaugeMetricFamily(
                "sluicegate_resumable_store_bytes",
                "Bytes the resumable-stream store keeps (frames and records)",
                value=self._kept_bytes(),
            )
        yield CounterMetricFamily(
            "sluicegate_resumable_resumes",
            "Reads of a log other than its first connection's",
            value=streams.resumes,
        )
        yield CounterMetricFamily(
            "sluicegate_resumable_given_up",
            "Resumable streams aborted by the server: no reader within the grace "
            "period, or a full buffer",
            value=streams.given_up,
        )


class LedgerCounts(Protocol):
    """What ``Metrics.watch_ledger`` reads per scrape (``Ledger``)."""

    @property
    def write_errors(self) -> int: ...

    repaired_rows: int


class LedgerCollector(Collector):
    """The ledger's rows that could not be written as they were, per scrape."""

    def __init__(self, ledger: LedgerCounts) -> None:
        self._ledger = ledger

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "sluicegate_ledger_write_errors",
            "Ledger statements the database could not take and that were dropped "
            "(each logged in full); the writer went on with the rest",
            value=self._ledger.write_errors,
        )
        yield CounterMetricFamily(
            "sluicegate_ledger_repaired_rows",
            "Ledger rows written with values repaired so that they could be "
            "stored (a count past 64 bits, NaN, a negative, text a database "
            "refuses); each logged, its usage marked estimated",
            value=self._ledger.repaired_rows,
        )


class UpstreamsCollector(Collector):
    """Per-upstream series of the engines that serve from a pool, per scrape."""

    _GAUGES = (
        ("in_flight", "Streams in flight on the upstream"),
        ("max_streams", "The upstream's cap of streams in flight"),
        ("healthy", "1 while the upstream passes its health checks"),
        ("ejected", "1 while the upstream is ejected after failures"),
    )
    _COUNTERS = (
        ("streams", "Streams started on the upstream"),
        ("failures", "Upstream streams that failed (before or after content)"),
        ("refusals", "Requests the upstream refused with a status before content"),
        ("ejections", "Times the upstream was ejected after failures in a row"),
        (
            "usage_rejected",
            "Streams whose usage could not be true: dropped, the server's own "
            "count billed (an estimate)",
        ),
    )

    def __init__(self, engines: Sequence[TextEngine]) -> None:
        self._engines = engines

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "upstream"]
        gauges = {
            name: GaugeMetricFamily(f"sluicegate_upstream_{name}", doc, labels=labels)
            for name, doc in self._GAUGES
        }
        counters = {
            name: CounterMetricFamily(f"sluicegate_upstream_{name}", doc, labels=labels)
            for name, doc in self._COUNTERS
        }
        ttft = SummaryMetricFamily(
            "sluicegate_upstream_time_to_first_token_seconds",
            "From a stream's start on the upstream to its first content",
            labels=labels,
        )
        for engine in self._engines:
            model = engine.model.id
            for row in engine.upstream_counters():
                values = [model, row.name]
                gauges["in_flight"].add_metric(values, row.in_flight)
                gauges["max_streams"].add_metric(values, row.max_streams)
                gauges["healthy"].add_metric(values, int(row.healthy))
                gauges["ejected"].add_metric(values, int(row.ejected))
                counters["streams"].add_metric(values, row.streams_total)
                counters["failures"].add_metric(values, row.failures_total)
                counters["refusals"].add_metric(values, row.refusals_total)
                counters["ejections"].add_metric(values, row.ejections_total)
                counters["usage_rejected"].add_metric(values, row.usage_rejected_total)
                ttft.add_metric(values, row.ttft_count, row.ttft_s_sum)
        yield from gauges.values()
        yield from counters.values()
        yield ttft
