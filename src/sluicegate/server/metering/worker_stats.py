"""``/engine/stats`` over every worker: each publishes its engines' stats in a file.

Under ``serve --workers``, an engine that runs inside each worker (the
gateway's upstream pools, the scripted engine) has stats that describe that
worker only. Each worker writes them to ``<folder>/<pid>.json`` (atomically:
a temporary file, then a rename) every ``PUBLISH_INTERVAL_S`` and whenever it
answers ``/engine/stats``, and the worker that answers sums every live
worker's file (``total``): counts add up, id lists are joined, the first
failure is kept. An engine whose ``stats()`` already covers every worker (the
engine process: ``Capabilities.shared_stats``) is not summed.

A worker that died leaves its file; files of pids that no longer run are
skipped (a pid reused by another process is a blur of one interval at worst).

Spec: docs/serving.md, "Workers".
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from sluicegate.engines.base import Engine
from sluicegate.engines.clocks import Timer, Timers
from sluicegate.engines.values import EngineStats

__all__ = ["PUBLISH_INTERVAL_S", "RUN_DIR", "WorkerStats", "alive"]

PUBLISH_INTERVAL_S = 0.5
"""Seconds between two writes of a worker's stats file."""

RUN_DIR = "SLUICEGATE_WORKERS_DIR"
"""The environment variable naming the folder ``serve --workers`` shares with
its workers (``workers.py`` sets it)."""


class WorkerStats:
    """This worker's stats file, and the sum of every worker's.

    Args:
        folder: the shared folder (made if missing).
        engines: the engines of this worker, by model id.
    """

    def __init__(self, folder: Path, engines: dict[str, Engine]) -> None:
        self._folder = folder
        self._engines = engines
        self._path = folder / f"{os.getpid()}.json"
        self._timer: Timer | None = None
        folder.mkdir(parents=True, exist_ok=True)

    def start(self, clock: Timers) -> None:
        """Publish now, then every ``PUBLISH_INTERVAL_S`` on ``clock`` until
        ``close``."""
        with contextlib.suppress(OSError):  # a full disk: no stats, still service
            self.publish()
        due = clock.time() + PUBLISH_INTERVAL_S
        self._timer = clock.call_at(due, lambda: self.start(clock))

    def publish(self) -> None:
        """Write this worker's stats of every engine that is not shared."""
        stats = {
            model: dataclasses.asdict(engine.stats())
            for model, engine in self._engines.items()
            if not engine.capabilities.shared_stats
        }
        temporary = self._path.with_suffix(".tmp")
        temporary.write_text(json.dumps(stats))
        temporary.replace(self._path)

    def total(self, model: str, own: EngineStats) -> dict[str, Any]:
        """``own`` (this worker's stats of ``model``) plus every other live
        worker's, as ``/engine/stats`` answers them."""
        summed = dataclasses.asdict(own)
        engine = self._engines.get(model)
        if engine is None or engine.capabilities.shared_stats:
            return summed
        for path in self._folder.glob("*.json"):
            if path == self._path or not alive(path.stem):
                continue
            with contextlib.suppress(OSError, ValueError):
                other = json.loads(path.read_text()).get(model)
                if other is not None:
                    summed = _add(summed, other)
        return summed

    def close(self) -> None:
        """Stop publishing; remove this worker's file (it stops serving)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with contextlib.suppress(OSError):
            self._path.unlink()


def alive(name: str) -> bool:
    """Whether ``name`` (a file's stem) is the pid of a running process."""
    if not name.isdigit():
        return False
    try:
        os.kill(int(name), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _add(mine: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    out = dict(mine)
    for name, value in other.items():
        held = out.get(name)
        if isinstance(held, bool) or held is None:
            out[name] = held if held is not None else value
        elif isinstance(held, int | float) and isinstance(value, int | float):
            out[name] = held + value
        elif isinstance(held, list | tuple) and isinstance(value, list):
            out[name] = [*held, *value]
    return out
