"""The Starlette app: OpenAI-compatible routes in front of one engine or several.

``create_app(engine, config)`` serves:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: an event stream
  or one JSON body (``completion_routes.py``); the Responses and Messages APIs'
  routes (``responses_routes.py``, ``messages_routes.py``);
- ``GET /v1/models``: every served model, OpenAI list shape, plus
  ``context_length``;
- ``GET /health``: liveness, ``{"status": "ok"}`` (``"draining"`` during a
  graceful shutdown, still 200);
- ``GET /ready``: readiness, 200 ``{"status": "ready"}``, or 503 with
  ``Retry-After`` once the server drains (``shutdown.py``);
- ``GET /metrics``: Prometheus text exposition (``metrics.py``);
- ``GET /engine/stats``: the engine's ``EngineStats`` as JSON, for operators and
  tests;
- ``GET /`` and ``GET /playground``: the web playground (``playground.py``), and
  ``GET /engine/requests``: the ledger's newest rows, which its server view shows.

Those ``GET`` endpoints are ``info_routes.py``'s; the two generation endpoints
and the parts every route shares are ``completion_routes.py``'s.

Every error before the first byte uses the OpenAI error shape, unknown paths
(404) and wrong methods (405) included. No middleware is installed: in
particular no GZip, which would buffer event streams; event-stream bodies skip
any middleware added inside the app (``sse_response.BODY_SEND``), so wrap the
app from outside. CORS, when ``config.cors_origins`` names origins, is
``cors.py``'s, before the guard: it answers their preflights and adds its
headers to every response start. The engine is closed when the app shuts down.

Spec: OpenAI API reference, "Chat", "Completions", "Models" and "Error codes";
docs/DESIGN.md, "Status first, errors in band".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from sluicegate.engines.base import Engine, StartingEngine
from sluicegate.engines.clocks import Timers
from sluicegate.server.admission.access import PAGE_PATH
from sluicegate.server.apis.completion_routes import CompletionRoutes
from sluicegate.server.apis.info_routes import InfoRoutes
from sluicegate.server.apis.messages_api import MESSAGES_PATHS
from sluicegate.server.apis.messages_routes import MessagesRoutes
from sluicegate.server.apis.responses_routes import ResponsesRoutes
from sluicegate.server.app.playground import PlaygroundRoutes
from sluicegate.server.config import ServerConfig
from sluicegate.server.http.answers import http_error, server_error
from sluicegate.server.http.cors import Cors
from sluicegate.server.resumable.routes import ResumableRoutes
from sluicegate.server.streaming.sse_response import BODY_SEND

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def create_app(
    engine: Engine | Sequence[Engine],
    config: ServerConfig | None = None,
    *,
    clock: Timers | None = None,
) -> Starlette:
    """The ASGI app serving ``engine`` with ``config`` (defaults when ``None``).

    ``engine`` may be several, one per model id (``models.py``): the first is
    the default model, the one ``/metrics`` and ``/engine/stats`` describe unless
    asked for another (``/engine/stats?model=ID``).

    The app's ``state`` holds ``engine`` (the default one), ``models``
    (``ServedModels``), ``config``, ``ledger`` (a ``Ledger`` with one row per
    request, in ``config.ledger_path`` or ``ledger_url`` when set), ``live``
    (the running responses' buffers), ``drain`` (``Drain``: run it to shut down
    gracefully) and ``metrics`` (``Metrics``; ``serve`` counts the connection
    refusals of ``connections.py`` with its ``refuse``). On shutdown every
    engine is closed (every KV cell freed), then the ledger (what its writer
    thread holds is committed first). The chat template is compiled here, so a model
    whose template does not compile fails at startup, not per request.

    ``clock`` is what the streams' timers run on (heartbeats, stuck writes,
    pacing, the cadence, the first-token and request deadlines): the running
    event loop when ``None``; tests step a ``ManualClock``.

    Raises:
        jinja2.TemplateSyntaxError: the model's chat template does not compile.
        ValueError: two engines serve the same model id.

    Spec: OpenAI API reference, "Create chat completion", "Create completion".
    """
    engines = [engine] if not isinstance(engine, Sequence) else list(engine)
    routes = CompletionRoutes(engines, config or ServerConfig(), clock)
    messages = MessagesRoutes(routes)
    responses = ResponsesRoutes(routes, routes.resumable)
    info = InfoRoutes(routes.models, routes.drain, routes.metrics_, routes.config)
    config_ = routes.config
    page = PlaygroundRoutes(routes.ledger, config_.retry_after_s, config_.workers > 1)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loop_lag = routes.metrics_.watch_loop()
        worker_stats = info.worker_stats
        if worker_stats is not None:  # serve --workers: for the others to sum
            worker_stats.start(asyncio.get_running_loop())
        if info.worker_metrics is not None:
            await info.worker_metrics.start()
        for served in routes.models:
            if isinstance(served.engine, StartingEngine):
                await served.engine.start()
        yield
        loop_lag.stop()
        if worker_stats is not None:
            worker_stats.close()
        if info.worker_metrics is not None:
            info.worker_metrics.close()
        await routes.resumable.aclose()  # producers record their rows first
        for served in routes.models:
            await served.engine.aclose()
        await routes.ledger.aclose()
        await routes.close_redis()
        stats = routes.engine.stats()
        logger.info(
            "stopped: %d KV cells used, %d running, %d queued; ledger closed",
            stats.kv_cells_used,
            stats.running,
            stats.queued,
        )

    app = _App(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            *responses.routes(),
            Route("/v1/messages", messages.create, methods=["POST"]),
            Route("/v1/messages/count_tokens", messages.count_tokens, methods=["POST"]),
            *ResumableRoutes(routes.resumable).routes(),
            Route("/v1/models", info.list_models, methods=["GET"]),
            Route("/v1/models/{model:path}", info.retrieve_model, methods=["GET"]),
            Route("/health", info.health, methods=["GET"]),
            Route("/ready", info.ready, methods=["GET"]),
            Route("/metrics", info.metrics, methods=["GET"]),
            Route("/engine/stats", info.engine_stats, methods=["GET"]),
            Route("/openapi.json", info.openapi, methods=["GET"]),
            Route("/engine/requests", page.recent_requests, methods=["GET"]),
            Route("/", page.root, methods=["GET"]),
            Route(PAGE_PATH, page.page, methods=["GET"]),
            Route(PAGE_PATH + "/{name}", page.asset, methods=["GET"]),
        ],
        exception_handlers={
            HTTPException: http_error,
            Exception: server_error(MESSAGES_PATHS),
        },
        lifespan=lifespan,
    )
    app.guard = routes.guard
    app.cors = Cors(routes.config.cors_origins) if routes.config.cors_origins else None
    app.state.engine = routes.engine
    app.state.models = routes.models
    app.state.config = routes.config
    app.state.ledger = routes.ledger
    app.state.live = routes.live
    app.state.drain = routes.drain
    app.state.resumable = routes.resumable
    app.state.metrics = routes.metrics_
    return app


class _App(Starlette):
    """Starlette, with the server's own ``send`` in each HTTP scope (``BODY_SEND``),
    and ``guard`` before routing: a response it returns is the answer."""

    guard: Callable[[Scope], Response | None] | None = None
    cors: Cors | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope[BODY_SEND] = send
        try:
            if self.cors is not None:  # before the guard: a preflight has no key
                preflight = self.cors.preflight(scope)
                if preflight is not None:
                    await preflight(scope, receive, send)
                    return
                send = self.cors.wrap(scope, send)
            refusal = self.guard(scope) if self.guard is not None else None
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            await super().__call__(scope, receive, send)
        finally:
            # The server's send may hold the scope (uvicorn's cycle does): a
            # reference cycle that only the collector would free.
            del scope[BODY_SEND]
