"""The Starlette app: OpenAI-compatible routes in front of one engine.

``create_app(engine, config)`` serves:

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: read the body (413
  over the limit), validate (400), resolve the model (404), template and tokenize,
  check the context window (400), submit to the engine (503 when its queue is
  full), then answer with an event stream or one JSON body (``streaming.py``);
- ``GET /v1/models``: the served model, OpenAI list shape, plus
  ``context_length``;
- ``GET /health``: ``{"status": "ok"}``;
- ``GET /engine/stats``: the engine's ``EngineStats`` as JSON, for operators and
  tests.

Every error before the first byte uses the OpenAI error shape, unknown paths (404)
and wrong methods (405) included. Every request is recorded once in
``app.state.ledger``. No middleware is installed: in particular no GZip, which
would buffer event streams. The engine is closed when the app shuts down.

Spec: OpenAI API reference, "Chat", "Completions", "Models" and "Error codes";
../shared/DESIGN.md, "Status first, errors in band".
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.core.chunks import Endpoint, dumps, error_payload
from sluicegate.core.endstate import EndState
from sluicegate.core.errors import EngineError, EngineUnavailable, RequestError
from sluicegate.engines.base import Engine
from sluicegate.server.bodies import read_json_object
from sluicegate.server.config import ServerConfig
from sluicegate.server.generation import Generation
from sluicegate.server.ledger import Ledger, LedgerRow
from sluicegate.server.prepare import (
    Plan,
    new_response_id,
    plan_chat,
    plan_completion,
)
from sluicegate.server.schemas import parse_chat_request, parse_completion_request
from sluicegate.server.streaming import (
    CLIENT_CLOSED,
    CompletionResponse,
    EventStreamResponse,
)
from sluicegate.server.templates import ChatTemplate

__all__ = ["create_app"]

_Planner = Callable[[dict[str, Any], str], Plan]


def create_app(engine: Engine, config: ServerConfig | None = None) -> Starlette:
    """The ASGI app serving ``engine`` with ``config`` (defaults when ``None``).

    The app's ``state`` holds ``engine``, ``config`` and ``ledger`` (a ``Ledger``
    with one row per request). The chat template is compiled here, so a model
    whose template does not compile fails at startup, not per request.

    Raises:
        jinja2.TemplateSyntaxError: the model's chat template does not compile.

    Spec: OpenAI API reference, "Create chat completion", "Create completion".
    """
    routes = _Routes(engine, config or ServerConfig())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await engine.aclose()

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", routes.chat_completions, methods=["POST"]),
            Route("/v1/completions", routes.completions, methods=["POST"]),
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/engine/stats", routes.engine_stats, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
        lifespan=lifespan,
    )
    app.state.engine = engine
    app.state.config = routes.config
    app.state.ledger = routes.ledger
    return app


class _Routes:
    """The endpoints, sharing one engine, config, chat template and ledger."""

    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.template = ChatTemplate(engine.tokenizer)
        self.ledger = Ledger()

    async def chat_completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, Endpoint.CHAT, self._plan_chat)

    async def completions(self, request: Request) -> ASGIApp:
        return await self._generate(request, Endpoint.COMPLETION, self._plan_completion)

    async def models(self, request: Request) -> Response:
        model = self.engine.model
        card = {
            "id": model.id,
            "object": "model",
            "created": model.created,
            "owned_by": model.owned_by,
            "context_length": model.context_length,
        }
        return _json({"object": "list", "data": [card]})

    async def health(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def engine_stats(self, request: Request) -> Response:
        return _json(dataclasses.asdict(self.engine.stats()))

    def _plan_chat(self, body: dict[str, Any], response_id: str) -> Plan:
        request = parse_chat_request(body)
        return plan_chat(request, response_id, self.engine, self.template, self.config)

    def _plan_completion(self, body: dict[str, Any], response_id: str) -> Plan:
        request = parse_completion_request(body)
        return plan_completion(request, response_id, self.engine, self.config)

    async def _generate(
        self, request: Request, endpoint: Endpoint, planner: _Planner
    ) -> ASGIApp:
        """Everything up to the first byte; then the streaming or JSON response."""
        meter = _Meter(self.ledger, new_response_id(endpoint), request.url.path)
        try:
            body = await read_json_object(request, self.config.max_body_bytes)
            meter.plan = planner(body, meter.response_id)
            generation = Generation(self.engine, meter.plan)
            generation.start()
        except ClientDisconnect:  # gone while sending its body: nothing to answer
            meter.record(EndState.ABORTED, CLIENT_CLOSED)
            return _nothing
        except (RequestError, EngineError) as exc:
            response = _error_response(exc)
            meter.record(EndState.REJECTED, response.status_code)
            return response
        finally:
            if not meter.recorded and sys.exc_info()[0] is not None:
                meter.record(EndState.ERRORED, 500)  # a bug; Starlette answers 500
        meter.generation = generation
        plan = meter.plan
        if plan.stream:
            interval = self.config.heartbeat_interval_s
            return EventStreamResponse(generation, plan.header, interval, meter.record)
        return CompletionResponse(generation, plan.header, meter.record)


class _Meter:
    """What the ledger row of one request needs, gathered as the request goes."""

    def __init__(self, ledger: Ledger, response_id: str, path: str) -> None:
        self.ledger = ledger
        self.response_id = response_id
        self.path = path
        self.received_at = time.time()
        self.plan: Plan | None = None
        self.generation: Generation | None = None
        self.recorded = False

    def record(self, state: EndState, status: int) -> None:
        """Append this request's row to the ledger (once)."""
        self.recorded = True
        plan, generation = self.plan, self.generation
        usage = generation.usage if generation else None
        self.ledger.record(
            LedgerRow(
                request_id=self.response_id,
                endpoint=self.path,
                model=plan.header.model if plan else None,
                status=status,
                end_state=state,
                prompt_tokens=len(plan.prompt_token_ids) if plan else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                finish_reasons=generation.finish_reasons if generation else (),
                received_at=self.received_at,
                first_token_at=generation.first_token_at if generation else None,
                ended_at=time.time(),
            )
        )


async def _nothing(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app that sends nothing (the client is gone)."""


def _json(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(dumps(payload), status, headers, media_type="application/json")


def _error_response(exc: RequestError | EngineError) -> Response:
    if isinstance(exc, RequestError):
        payload = error_payload(exc.message, exc.error_type, exc.param, exc.code)
        return _json(payload, exc.status)
    status = 503 if isinstance(exc, EngineUnavailable) else 500
    headers = {"Retry-After": "1"} if exc.retryable else None
    return _json(
        error_payload(str(exc), "server_error", None, exc.code), status, headers
    )


async def _server_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware calls this, then re-raises for the log.
    message = "The server failed while handling this request"
    return _json(error_payload(message, "server_error", None, "internal_error"), 500)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}"
    else:
        message = exc.detail
    payload = error_payload(message, "invalid_request_error", None, None)
    return _json(payload, exc.status_code, dict(exc.headers or {}))
