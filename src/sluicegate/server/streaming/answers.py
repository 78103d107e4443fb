"""The app's JSON answers outside a generation: errors in the OpenAI shape.

``error_response`` answers an error raised before the first byte with the status
``statuses.status_of`` gives it, its OpenAI error body and, where the client may
retry, ``Retry-After``; ``server_error`` and ``http_error`` are Starlette's
exception handlers (a bug: 500; a routing error: 404 or 405).

Spec: OpenAI API reference, "Error codes"; RFC 9110, "10.2.3. Retry-After".
"""

from __future__ import annotations

import math
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluicegate.core.errors import EngineError, EngineRefused, RequestError
from sluicegate.core.wire.chunks import dumps, error_payload
from sluicegate.server.admission.keys import AdmissionError, Unavailable
from sluicegate.server.stores.event_store import (
    StoreError,
    store_error_code,
    store_refusal_message,
)
from sluicegate.server.streaming.statuses import status_of

__all__ = [
    "error_response",
    "http_error",
    "json_answer",
    "nothing",
    "server_error",
    "store_refusal",
    "store_unavailable",
]


async def nothing(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app that sends nothing (the client is gone)."""


def json_answer(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``payload`` as compact JSON with ``status``."""
    return Response(dumps(payload), status, headers, media_type="application/json")


def error_response(
    exc: RequestError | EngineError | AdmissionError, retry_after_s: int
) -> Response:
    """The JSON answer of an error raised before the first byte.

    Args:
        exc: the error; an ``EngineRefused`` keeps its own status, message, code
            and ``Retry-After`` (rounded up to whole seconds).
        retry_after_s: ``Retry-After`` (seconds) of a retryable engine error.
    """
    status = status_of(exc)
    if isinstance(exc, EngineRefused):
        payload = error_payload(str(exc), exc.error_type, exc.param, exc.error_code)
        wait = exc.retry_after_s
        headers = {"Retry-After": str(math.ceil(wait))} if wait is not None else None
        return json_answer(payload, status, headers)
    if isinstance(exc, RequestError):
        payload = error_payload(exc.message, exc.error_type, exc.param, exc.code)
        return json_answer(payload, status)
    if isinstance(exc, AdmissionError):
        payload = error_payload(exc.message, exc.error_type, None, exc.code)
        retry = exc.retry_after_s
        headers = {"Retry-After": str(retry)} if retry is not None else None
        return json_answer(payload, status, headers)
    headers = {"Retry-After": str(retry_after_s)} if exc.retryable else None
    return json_answer(
        error_payload(str(exc), "server_error", None, exc.code), status, headers
    )


async def server_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler of an exception no route caught: a 500, no details."""
    # Starlette's ServerErrorMiddleware calls this, then re-raises for the log.
    message = "The server failed while handling this request"
    return json_answer(
        error_payload(message, "server_error", None, "internal_error"), 500
    )


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler of a routing error (404, 405) in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"Invalid URL ({request.method} {request.url.path})"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}"
    else:
        message = exc.detail
    payload = error_payload(message, "invalid_request_error", None, None)
    return json_answer(payload, exc.status_code, dict(exc.headers or {}))


def store_unavailable(exc: StoreError, retry_after_s: int) -> Response:
    """The 503 (with ``Retry-After``) of a shared store of resumable streams
    that cannot be reached (``resume_store_unavailable``) or is full
    (``resume_store_full``)."""
    message = store_refusal_message(exc)
    payload = error_payload(message, "server_error", None, store_error_code(exc))
    return json_answer(payload, 503, {"Retry-After": str(retry_after_s)})


def store_refusal(exc: StoreError, retry_after_s: int) -> Unavailable:
    """What a request is refused with before its first byte when the store of
    resumable streams failed: 503 with ``Retry-After`` and
    ``store_error_code(exc)``."""
    return Unavailable(store_refusal_message(exc), store_error_code(exc), retry_after_s)
