"""The endpoints that describe the server: models, health, readiness, metrics.

``InfoRoutes`` answers ``GET /v1/models`` (every served model, OpenAI list
shape, plus ``context_length``), ``GET /v1/models/{model}`` (one of them, by
id or alias), ``GET /health`` (liveness: ``ok``, ``draining``,
``engine_restarting`` while an engine process is being restarted, or 503
``engine_failed`` once an engine's worker died; with ``serve --workers``, also
the ``pid`` of the worker process that answered), ``GET /ready`` (200, or 503
with ``Retry-After`` once the server drains, and while an engine is
unavailable: ``EngineStats.unavailable``), ``GET /metrics`` (Prometheus
text), ``GET /engine/stats`` (one engine's ``EngineStats`` as JSON, summed over the
workers of ``serve --workers``: ``worker_stats.py``; 404 for an unknown
``?model=``) and ``GET /openapi.json``. Under ``serve --workers``, ``/metrics``
sums every worker's series (``worker_metrics.py``). None of them touches an engine
beyond its ``model`` and ``stats()``.

Spec: OpenAI API reference, "Models" ("List models", "Retrieve model").
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.status import HTTP_503_SERVICE_UNAVAILABLE

from sluicegate.core.errors import EngineUnavailable, ModelNotFound
from sluicegate.engines.base import ModelInfo
from sluicegate.server.apis.openapi import openapi_document
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import Unavailable
from sluicegate.server.metering.metrics import CONTENT_TYPE, Metrics
from sluicegate.server.metering.worker_metrics import WorkerMetrics
from sluicegate.server.metering.worker_stats import RUN_DIR, WorkerStats
from sluicegate.server.prepare.models import ServedModels
from sluicegate.server.streaming.shutdown import Drain

__all__ = ["InfoRoutes", "shutting_down"]


def shutting_down(config: ServerConfig) -> Unavailable:
    """The 503 of a draining server, with ``config``'s ``Retry-After``."""
    return Unavailable(
        "The server is shutting down; retry on another replica",
        "server_shutting_down",
        config.retry_after_s,
    )


class InfoRoutes:
    """The endpoints about the server, over the app's models, drain and metrics."""

    def __init__(
        self,
        models: ServedModels,
        drain: Drain,
        metrics: Metrics,
        config: ServerConfig,
    ) -> None:
        self.models = models
        self.drain = drain
        self.metrics_ = metrics
        self.config = config
        self._openapi = openapi_document()
        folder = os.environ.get(RUN_DIR)
        shared = Path(folder) if folder and config.workers > 1 else None
        self.worker_stats = (
            None
            if shared is None
            else WorkerStats(shared, {s.id: s.engine for s in models})
        )
        self.worker_metrics = (
            None if shared is None else WorkerMetrics(shared, metrics.local)
        )

    async def list_models(self, request: Request) -> Response:
        cards = [_card(served.engine.model) for served in self.models]
        return json_answer({"object": "list", "data": cards})

    async def retrieve_model(self, request: Request) -> Response:
        """``GET /v1/models/{model}``: the model's card, as listed (an alias
        gets its model's); 404 ``model_not_found`` for another name."""
        try:
            served = self.models.resolve(request.path_params["model"])
        except ModelNotFound as exc:
            return error_answer(exc)
        return json_answer(_card(served.engine.model))

    async def openapi(self, request: Request) -> Response:
        return json_answer(self._openapi)

    async def health(self, request: Request) -> Response:
        for served in self.models:
            failure = served.engine.stats().failure
            if failure is not None:
                payload = {"status": "engine_failed", "failure": failure}
                if len(self.models) > 1:
                    payload["model"] = served.id
                return json_answer(payload, HTTP_503_SERVICE_UNAVAILABLE)
        # An engine process being restarted leaves this process alive: a
        # liveness probe must not have the worker restarted as well.
        restarting = any(s.engine.stats().unavailable for s in self.models)
        state = "engine_restarting" if restarting else "ok"
        status: dict[str, object] = {
            "status": "draining" if self.drain.draining else state
        }
        if self.config.workers > 1:
            status["pid"] = os.getpid()
        return json_answer(status)

    async def ready(self, request: Request) -> Response:
        if self.drain.draining:
            return error_answer(shutting_down(self.config))
        for served in self.models:
            unavailable = served.engine.stats().unavailable
            if unavailable is not None:
                error = EngineUnavailable(f"model {served.id!r}: {unavailable}")
                return error_answer(error, self.config.retry_after_s)
        return json_answer({"status": "ready"})

    async def metrics(self, request: Request) -> Response:
        workers = self.worker_metrics
        others = [] if workers is None else await workers.gather()
        return Response(self.metrics_.render(others), media_type=CONTENT_TYPE)

    async def engine_stats(self, request: Request) -> Response:
        try:
            served = self.models.resolve(request.query_params.get("model"))
        except ModelNotFound as exc:
            return error_answer(exc, self.config.retry_after_s)
        stats = served.engine.stats()
        if self.worker_stats is None:
            return json_answer(dataclasses.asdict(stats))
        self.worker_stats.publish()
        return json_answer(self.worker_stats.total(served.id, stats))


def _card(model: ModelInfo) -> dict[str, object]:
    """One model as ``/v1/models`` shows it, plus its ``context_length``."""
    return {
        "id": model.id,
        "object": "model",
        "created": model.created,
        "owned_by": model.owned_by,
        "context_length": model.context_length,
    }
