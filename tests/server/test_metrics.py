"""``/metrics``: Prometheus text with request, token, stream and engine metrics;
under ``serve --workers``, the scrape-time series summed over the workers."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.applications import Starlette

from sluicegate.engines.base import Capabilities
from sluicegate.engines.clocks import ManualClock
from sluicegate.engines.scripted.engine import ScriptedEngine
from sluicegate.server.app.factory import create_app
from sluicegate.server.config import ServerConfig
from sluicegate.server.metering.metrics import (
    LOOP_LAG_INTERVAL_S,
    MULTIPROC_DIR,
    LoopLag,
    Metrics,
)
from sluicegate.server.metering.worker_metrics import SummedCollector, WorkerMetrics
from sluicegate.server.streaming.buffer import LiveStreams
from tests.polling import wait_until

from .asgi import CHAT, HELLO, Exchange, on_clock

RESUMABLE_BODY = {
    "messages": HELLO,
    "stream": True,
    "stream_options": {"resumable": True},
}

pytestmark = pytest.mark.anyio


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


async def test_metrics_count_requests_tokens_and_read_the_engine(
    app: Starlette,
) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post(CHAT, json={"messages": HELLO, "stream": True})
        await client.post(CHAT, json={"messages": HELLO, "n": 0})
        response = await client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    finished = 'sluicegate_requests_total{end_state="finished",status="200"}'
    rejected = 'sluicegate_requests_total{end_state="rejected",status="400"}'
    assert _value(text, finished) == 1
    assert _value(text, rejected) == 1
    assert _value(text, 'sluicegate_tokens_total{kind="generated"}') > 0
    assert _value(text, "sluicegate_time_to_first_token_seconds_count") == 1
    assert _value(text, "sluicegate_inter_token_latency_seconds_count") == 1
    assert _value(text, "sluicegate_request_duration_seconds_count") == 2
    assert _value(text, "sluicegate_active_streams") == 0
    assert _value(text, "sluicegate_kv_cells_used") == 0
    assert _value(text, "sluicegate_kv_cells_total") > 0
    assert _value(text, "sluicegate_engine_queue_depth") == 0
    for name in ("heartbeats_sent", "coalesced_events", "engine_wasted_tokens"):
        assert _value(text, f"sluicegate_{name}_total") >= 0


def test_loop_lag_reports_how_late_a_blocked_loop_ran_its_timer() -> None:
    clock = ManualClock()
    lags: list[float] = []
    lag = LoopLag(clock, lags.append, interval_s=0.25)
    clock.advance(0.5)
    assert lags == [0.0, 0.0]  # on time, twice
    clock.jump(1.25)  # a callback that held the loop: the timer was due at 0.75
    clock.step()
    assert lags == [0.0, 0.0, 1.0]  # it ran that late
    clock.advance(0.25)  # due again an interval after it ran
    assert lags == [0.0, 0.0, 1.0, 0.0]
    lag.stop()
    clock.advance(5)
    assert len(lags) == 4  # stopped: no more samples


def test_loop_lag_needs_a_positive_interval() -> None:
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="interval_s"):
            LoopLag(loop, lambda lag: None, interval_s=0)
    finally:
        loop.close()


async def test_the_app_samples_its_loop_lag_while_it_runs(app: Starlette) -> None:
    clock = ManualClock()
    app.state.metrics.timers = clock
    async with app.router.lifespan_context(app):
        clock.advance(LOOP_LAG_INTERVAL_S)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            text = (await c.get("/metrics")).text
    assert _value(text, "sluicegate_event_loop_lag_seconds_count") == 1
    clock.advance(LOOP_LAG_INTERVAL_S)  # stopped with the app
    assert (
        _value(
            app.state.metrics.render().decode(),
            "sluicegate_event_loop_lag_seconds_count",
        )
        == 1
    )


async def test_resumable_streams_are_counted_at_every_scrape() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(tokens_per_s=50, clock=clock)
    app = create_app(engine, ServerConfig(resume_grace_s=0.05), clock=clock)
    body = {**RESUMABLE_BODY, "max_tokens": 2}
    whole = Exchange(app, CHAT, body)  # read to its end, by its first reader
    await on_clock(clock, whole.run, 0.01)
    response_id = re.search(rb'"id":"(chatcmpl-[^"]+)"', whole.body)
    assert response_id is not None
    resumed = Exchange(
        app, f"{CHAT}/{response_id[1].decode()}/events", b"", method="GET"
    )
    await on_clock(clock, resumed.run, 0.01)
    assert resumed.status == 200
    left = Exchange(app, CHAT, {**RESUMABLE_BODY, "max_tokens": 1000})
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(left.run)
        content = lambda: b"data: " in left.body  # noqa: E731
        await on_clock(clock, anyio.sleep_forever, 0.01, content)
        assert left.status == 200, left.body
        left.leave()  # nobody resumes it: given up after the grace period
    metrics = app.state.metrics
    left_at = clock.time()
    given_up = lambda: b"given_up_total 1.0" in metrics.render()  # noqa: E731
    await on_clock(clock, anyio.sleep_forever, 0.01, given_up)
    assert 0.05 <= round(clock.time() - left_at, 6) < 0.07
    # and its task is done (its done callback runs one loop turn later)
    await wait_until(lambda: b"resumable_producers 0.0" in metrics.render(), 5)
    text = metrics.render().decode()
    assert _value(text, "sluicegate_resumable_resumes_total") == 1
    assert _value(text, "sluicegate_resumable_given_up_total") == 1
    assert _value(text, "sluicegate_resumable_producers") == 0
    assert _value(text, "sluicegate_resumable_store_bytes") > 0  # two kept logs


class _Series(Collector):
    """One worker's scrape-time series: a gauge, a counter, a labelled gauge."""

    def __init__(self, streams: int, heartbeats: int, upstreams: dict[str, int]):
        self.streams = streams
        self.heartbeats = heartbeats
        self.upstreams = upstreams

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("sluicegate_active_streams", "s", value=self.streams)
        yield CounterMetricFamily(
            "sluicegate_heartbeats_sent", "h", value=self.heartbeats
        )
        flights = GaugeMetricFamily("sluicegate_upstream_in_flight", "u", labels=["u"])
        for name, value in self.upstreams.items():
            flights.add_metric([name], value)
        yield flights


def _text(collector: Collector) -> bytes:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry)


async def test_a_scrape_sums_the_series_each_worker_reads_when_asked(
    tmp_path: Path,
) -> None:
    mine = _Series(3, 10, {"a": 1})
    theirs = _Series(4, 20, {"a": 2, "b": 5})
    here = WorkerMetrics(tmp_path, lambda: _text(mine), pid=os.getpid())
    there = WorkerMetrics(tmp_path, lambda: _text(theirs), pid=os.getppid())
    (tmp_path / "1.sock").write_bytes(b"")  # a live pid, and no socket: left out
    (tmp_path / "999999999.sock").write_bytes(b"")  # no such process: skipped
    await here.start()
    await there.start()
    try:
        theirs.streams = 6  # read when the scrape asks, not before
        with anyio.fail_after(10):
            others = await here.gather()
    finally:
        here.close()
        there.close()
    left = sorted(p.name for p in tmp_path.iterdir())  # noqa: ASYNC240
    assert left == ["1.sock", "999999999.sock"]  # each socket removed
    text = _text(SummedCollector([mine], others)).decode()
    assert _value(text, "sluicegate_active_streams") == 3 + 6
    assert _value(text, "sluicegate_heartbeats_sent_total") == 10 + 20
    assert _value(text, 'sluicegate_upstream_in_flight{u="a"}') == 1 + 2
    assert _value(text, 'sluicegate_upstream_in_flight{u="b"}') == 5  # theirs only
    assert _value(text, "sluicegate_scraped_workers") == 2


class _SharedEngine(ScriptedEngine):
    """An engine whose stats count every worker's requests (the engine process)."""

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(super().capabilities, shared_stats=True)


def test_an_engine_every_worker_shares_is_read_once_not_summed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(MULTIPROC_DIR, str(tmp_path))
    own, shared = ScriptedEngine(), _SharedEngine(kv_cells_total=777)
    mine = Metrics(shared, LiveStreams())
    other = Metrics(shared, LiveStreams()).local().decode()
    assert "sluicegate_kv_cells_total" not in other  # the answering worker's alone
    assert "sluicegate_active_streams" in other
    text = mine.render([other.encode()] * 2).decode()
    assert _value(text, "sluicegate_kv_cells_total") == 777
    assert _value(text, "sluicegate_scraped_workers") == 3
    per_worker = Metrics(own, LiveStreams())  # an engine in each worker: summed
    total = own.stats().kv_cells_total
    text = per_worker.render([per_worker.local()]).decode()
    assert _value(text, "sluicegate_kv_cells_total") == 2 * total
