"""The series read at scrape time, over every worker: each answers its own on a socket.

Under ``serve --workers``, the series of ended requests are kept in
prometheus-client's multiprocess files and summed by whichever worker answers
``/metrics`` (``metrics.py``). The series read at scrape time (live streams,
buffered bytes, heartbeats, resumable producers, the ledger's errors, an
engine that runs in each worker, upstream pools) live in each worker's
memory. So each worker also listens on ``<folder>/<pid>.sock`` and answers a
connection with the text exposition of those series, read then; the worker
that answers ``/metrics`` asks every other live worker at once
(``WorkerMetrics.gather``) and ``SummedCollector`` adds their samples to its
own, label set by label set: counters and gauges summed, as prometheus-client's
``livesum`` mode sums the gauges of live processes. A scrape so sees what every
worker has at that moment. ``sluicegate_scraped_workers`` says how many
workers' series a scrape holds; a worker that does not answer within
``GATHER_TIMEOUT_S`` is left out of it (logged), and a dead worker's
scrape-time counters leave the sums with it (a reset, to ``rate()``).

Why not the multiprocess files for these too: a gauge there is written at
every change, and these change per token (buffered bytes) or per engine step;
read at scrape time, they cost nothing per token.

The folder is the one ``serve --workers`` makes for its workers (mode 0700);
each socket is made 0600.

Spec: docs/serving.md, "Workers"; prometheus-client, "Multiprocess Mode".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from sluicegate.server.metering.worker_stats import alive

__all__ = ["GATHER_TIMEOUT_S", "SummedCollector", "WorkerMetrics"]

logger = logging.getLogger(__name__)

GATHER_TIMEOUT_S = 1.0
"""Seconds the answering worker waits for the others' series."""


class WorkerMetrics:
    """This worker's socket of scrape-time series, and the others' series.

    Args:
        folder: the folder every worker's socket is in (made if missing).
        local: this worker's scrape-time series, as Prometheus text, read when
            called.
        pid: this worker's process id (its socket's name).
    """

    def __init__(
        self, folder: Path, local: Callable[[], bytes], pid: int | None = None
    ) -> None:
        self._folder = folder
        self._local = local
        self._path = folder / f"{os.getpid() if pid is None else pid}.sock"
        self._server: asyncio.AbstractServer | None = None
        folder.mkdir(parents=True, exist_ok=True)

    async def start(self) -> None:
        """Listen on this worker's socket until ``close``.

        Raises:
            OSError: the socket cannot be made.
        """
        self._server = await asyncio.start_unix_server(self._answer, self._path)
        os.chmod(self._path, 0o600)

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError):
            writer.write(self._local())
            await writer.drain()
        writer.close()

    async def gather(self) -> list[bytes]:
        """The series of every other live worker, read now (one text each);
        those that do not answer within ``GATHER_TIMEOUT_S`` are left out."""
        paths = [
            path
            for path in self._folder.glob("*.sock")
            if path != self._path and alive(path.stem)
        ]
        texts = await asyncio.gather(*(self._read(path) for path in paths))
        return [text for text in texts if text is not None]

    async def _read(self, path: Path) -> bytes | None:
        try:
            async with asyncio.timeout(GATHER_TIMEOUT_S):
                reader, writer = await asyncio.open_unix_connection(path)
                try:
                    return await reader.read()
                finally:
                    writer.close()
        except (OSError, TimeoutError) as exc:
            logger.warning("worker %s left out of this scrape: %r", path.stem, exc)
            return None

    def close(self) -> None:
        """Stop answering; remove this worker's socket."""
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(OSError):
            self._path.unlink()


class SummedCollector(Collector):
    """``own`` collectors' series plus the samples of ``others`` (Prometheus
    text of the same series, one per other worker), summed per sample name and
    label set, with ``sluicegate_scraped_workers``.

    A sample only another worker has (an upstream only its pool has used) is
    added as it is.
    """

    def __init__(self, own: Sequence[Collector], others: Sequence[bytes]) -> None:
        self._own = own
        self._others = others

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in self._families():
            held = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type)
            )
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key not in values:
                    held.add_sample(sample.name, sample.labels, 0.0)
                    values[key] = 0.0
                values[key] += sample.value
        for family in families.values():
            family.samples = [
                sample._replace(
                    value=values[(sample.name, tuple(sorted(sample.labels.items())))]
                )
                for sample in family.samples
            ]
            yield family
        scraped = Metric(
            "sluicegate_scraped_workers",
            "Workers whose scrape-time series this answer sums (itself included)",
            "gauge",
        )
        scraped.add_sample("sluicegate_scraped_workers", {}, 1 + len(self._others))
        yield scraped

    def _families(self) -> Iterable[Metric]:
        for collector in self._own:
            yield from collector.collect()
        for text in self._others:
            yield from text_string_to_metric_families(text.decode())
