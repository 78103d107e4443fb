"""The answers of errors before the first byte, in each API's shape.

``describe`` gives what answers one error: its row of ``errors.KINDS`` (status,
OpenAI ``type``, default ``code``) with the message, ``param``, ``code`` and
``Retry-After`` it carries. ``error_answer`` writes it in the shape of an API
(``core.wire.error_body``): ``{"error": {"message", "type", "param", "code"}}``
for chat, completions and Responses; ``{"type": "error", "error": {"type",
"message"}}`` for Messages, its ``type`` from the status
(``core/wire/messages_bodies.py``: ``ERROR_TYPES``). After the first byte an
error is in band: a ``Fail`` that the API's stream machine frames;
``status_of`` gives the status of a non-streamed response a ``Fail`` ended
(``errors.STATUS_OF_CODE``).
``server_error`` and ``http_error`` are Starlette's exception handlers (a bug:
``InternalError``; a routing error: ``RouteNotFound`` or ``MethodNotAllowed``).

Spec: OpenAI API reference, "Error codes"; Anthropic API reference, "Errors";
RFC 9110, "10.2.3. Retry-After"; docs/DESIGN.md, "Status first, errors in band".
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluicegate.core.errors import (
    EngineError,
    EngineRefused,
    RequestError,
    SluicegateError,
)
from sluicegate.core.events import Fail
from sluicegate.core.wire.chunks import Endpoint, dumps, error_payload
from sluicegate.core.wire.contracts import error_body
from sluicegate.server.http.errors import (
    STATUS_OF_CODE,
    AdmissionError,
    CursorEvicted,
    InternalError,
    LogNotFound,
    MethodNotAllowed,
    ResponseFailed,
    RouteNotFound,
    StoreError,
    TooManyConnections,
    Unavailable,
    kind_of,
    store_error_code,
    store_refusal_message,
)

__all__ = [
    "Described",
    "describe",
    "error_answer",
    "http_error",
    "json_answer",
    "nothing",
    "server_error",
    "status_of",
    "store_refusal",
]


async def nothing(scope: Scope, receive: Receive, send: Send) -> None:
    """An ASGI app that sends nothing (the client is gone)."""


def json_answer(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """``payload`` as compact JSON with ``status``."""
    return Response(dumps(payload), status, headers, media_type="application/json")


def server_error(
    messages_paths: Collection[str],
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's handler of an exception no route caught: a 500, no details,
    in Anthropic's shape on ``messages_paths`` (it was OpenAI's there too)."""

    async def handle(request: Request, exc: Exception) -> Response:
        # Starlette's ServerErrorMiddleware calls this, then re-raises for the log.
        messages = request.scope["path"] in messages_paths
        endpoint = Endpoint.MESSAGES if messages else Endpoint.CHAT
        answer = error_answer(InternalError(), endpoint=endpoint)
        # uvicorn closes the connection after an exception: said here, a client
        # does not send its next request on it (it was reset 2 times in 5).
        answer.headers["connection"] = "close"
        return answer

    return handle


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's handler of a routing error (404, 405) in the OpenAI shape."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == kind_of(RouteNotFound).status:
        answer = error_answer(RouteNotFound(request.method, request.url.path))
    elif exc.status_code == kind_of(MethodNotAllowed).status:
        answer = error_answer(MethodNotAllowed(request.method, request.url.path))
    else:  # Starlette's own status, passed through
        payload = error_payload(exc.detail, "invalid_request_error", None, None)
        answer = json_answer(payload, exc.status_code)
    answer.headers.update(exc.headers or {})
    return answer


def store_refusal(exc: StoreError, retry_after_s: int) -> Unavailable:
    """What a request is refused with before its first byte when the store of
    resumable streams failed: 503 with ``Retry-After`` and
    ``store_error_code(exc)``."""
    return Unavailable(store_refusal_message(exc), store_error_code(exc), retry_after_s)


@dataclass(frozen=True, slots=True)
class Described:
    """One error as answered: its row of ``KINDS`` and what it carries.

    Attributes:
        status: HTTP status (400-599).
        error_type: OpenAI error ``type``.
        message: the text the client reads.
        param: the request parameter at fault, or ``None``.
        code: machine-readable code, or ``None``.
        retry_after_s: ``Retry-After`` in whole seconds, or ``None``.
    """

    status: int
    error_type: str
    message: str
    param: str | None = None
    code: str | None = None
    retry_after_s: int | None = None


def describe(exc: SluicegateError, retry_after_s: int | None = None) -> Described:
    """What answers ``exc`` before the first byte.

    Args:
        exc: the error.
        retry_after_s: ``Retry-After`` (seconds) of an error the client may
            retry that carries no wait of its own: a retryable engine error, a
            failed store, too many connections.

    Returns:
        ``kind_of`` its class, with the message, ``param``, ``code`` (its own,
        else the row's) and ``Retry-After`` it carries. An ``EngineRefused``
        keeps its own status and type when it carries them, and its own code
        and wait (rounded up to whole seconds); a ``StoreError`` gets the
        fixed message of its code.

    Raises:
        LookupError: ``exc`` is not an error the server answers.
    """
    kind = kind_of(type(exc))
    if isinstance(exc, EngineRefused):
        wait = exc.retry_after_s
        return Described(
            kind.status if exc.status is None else exc.status,
            exc.error_type or kind.error_type,
            str(exc),
            exc.param,
            exc.error_code,
            None if wait is None else math.ceil(wait),
        )
    if isinstance(exc, RequestError):
        code = exc.code if exc.code is not None else kind.code
        return Described(kind.status, kind.error_type, exc.message, exc.param, code)
    if isinstance(exc, AdmissionError):
        return Described(
            kind.status, kind.error_type, exc.message, None, exc.code, exc.retry_after_s
        )
    if isinstance(exc, EngineError):
        wait = retry_after_s if exc.retryable else None
        return Described(kind.status, kind.error_type, str(exc), None, exc.code, wait)
    if isinstance(exc, CursorEvicted | LogNotFound):
        return Described(kind.status, kind.error_type, str(exc), None, kind.code)
    if isinstance(exc, StoreError):
        message = store_refusal_message(exc)
        return Described(
            kind.status, kind.error_type, message, None, kind.code, retry_after_s
        )
    if isinstance(exc, ResponseFailed):
        return Described(kind.status, kind.error_type, str(exc), None, exc.code)
    wait = retry_after_s if isinstance(exc, TooManyConnections) else None
    return Described(kind.status, kind.error_type, str(exc), None, kind.code, wait)


def error_answer(
    exc: SluicegateError,
    retry_after_s: int | None = None,
    endpoint: Endpoint = Endpoint.CHAT,
    *,
    param: str | None = None,
) -> Response:
    """The JSON answer of ``exc`` before the first byte, in ``endpoint``'s shape.

    Args:
        exc: the error (see ``describe``).
        retry_after_s: see ``describe``.
        endpoint: chat, completions and Responses answer ``{"error":
            {"message", "type", "param", "code"}}``; Messages answers
            ``{"type": "error", "error": {"type", "message"}}``.
        param: names the parameter at fault when ``exc`` does not (a cursor
            the store evicted, named by the route that read it).

    Returns:
        The status of ``describe``, the body, and ``Retry-After`` when the
        client may retry.

    Raises:
        LookupError: ``exc`` is not an error the server answers.
    """
    d = describe(exc, retry_after_s)
    body = error_body(
        endpoint, d.status, d.message, d.error_type, d.param or param, d.code
    )
    wait = d.retry_after_s
    headers = None if wait is None else {"Retry-After": str(wait)}
    return Response(dumps(body), d.status, headers, media_type="application/json")


def status_of(error: SluicegateError | Fail) -> int:
    """The HTTP status that answers ``error``.

    Args:
        error: an exception raised before the first byte, or the ``Fail`` that
            ended a non-streamed response.

    Returns:
        An ``EngineRefused``'s own status, when it carries one; ``kind_of``
        any other exception's class; ``STATUS_OF_CODE`` for a ``Fail`` (500
        for a code not there).

    Raises:
        LookupError: an exception the server never answers.
    """
    if isinstance(error, Fail):
        return STATUS_OF_CODE.get(error.code or "", kind_of(EngineError).status)
    if isinstance(error, EngineRefused) and error.status is not None:
        return error.status  # the engine's own (an upstream server's answer)
    return kind_of(type(error)).status
