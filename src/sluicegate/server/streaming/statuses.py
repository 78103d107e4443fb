"""The one map from an error to the HTTP status the server answers it with.

``status_of`` covers every error answered before the first byte (a refused or
invalid request, an engine that cannot take it) and every ``Fail`` that ends a
non-streamed response (an engine error, a timeout, the shutdown). An event
stream's status is always 200: a ``Fail`` after its first byte is in band.

Invariants:
    - Classes are matched most specific first: a subclass with no entry of its
      own gets its nearest listed base's status.
    - A ``Fail`` is matched by its ``code``; an unknown code is a 500.

Spec: docs/DESIGN.md, "Status first, errors in band"; OpenAI API reference,
"Error codes".
"""

from __future__ import annotations

from collections.abc import Mapping

from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineRefused,
    EngineUnavailable,
    ModelNotFound,
    RequestError,
    SluicegateError,
    UnsupportedMediaType,
)
from sluicegate.core.events import Fail
from sluicegate.server.admission.access import HostNotAllowed
from sluicegate.server.admission.keys import (
    AdmissionError,
    Forbidden,
    OverQuota,
    Unauthenticated,
    Unavailable,
)
from sluicegate.server.stores.event_store import IdempotencyConflict
from sluicegate.server.streaming.shared import (
    FIRST_TOKEN_TIMEOUT,
    REQUEST_TIMEOUT,
    SERVER_SHUTDOWN,
)

__all__ = ["CLIENT_CLOSED", "STATUS_OF_CLASS", "STATUS_OF_CODE", "status_of"]

CLIENT_CLOSED = 499
"""The status recorded when the client left before any status was sent (nginx's
convention; it never goes on the wire)."""

STATUS_OF_CLASS: Mapping[type[object], int] = {
    RequestError: 400,
    ModelNotFound: 404,
    IdempotencyConflict: 409,
    BodyTooLarge: 413,
    UnsupportedMediaType: 415,
    AdmissionError: 400,
    Unauthenticated: 401,
    Forbidden: 403,
    HostNotAllowed: 421,
    OverQuota: 429,
    Unavailable: 503,
    EngineError: 500,
    EngineUnavailable: 503,
}
"""Error class -> status; a class not listed takes its nearest listed base's."""

STATUS_OF_CODE: Mapping[str, int] = {
    EngineUnavailable.code: 503,
    SERVER_SHUTDOWN: 503,
    FIRST_TOKEN_TIMEOUT: 504,
    REQUEST_TIMEOUT: 504,
}
"""``Fail.code`` -> status of a non-streamed response; any other code is a 500."""


def status_of(error: SluicegateError | Fail) -> int:
    """The HTTP status that answers ``error``.

    Args:
        error: an exception raised before the first byte, or the ``Fail`` that
            ended a non-streamed response.

    Returns:
        The status: an ``EngineRefused``'s own; from ``STATUS_OF_CLASS`` for
        any other exception (by its class,
        then its bases in method resolution order), from ``STATUS_OF_CODE`` for
        a ``Fail`` (500 for a code not there).

    Raises:
        LookupError: an exception with no listed class among its bases (a
            ``StreamError`` or ``ProtocolError``: never answered by the server).
    """
    if isinstance(error, Fail):
        return STATUS_OF_CODE.get(error.code or "", 500)
    if isinstance(error, EngineRefused):
        return error.status  # the engine's own (an upstream server's answer)
    for cls in type(error).__mro__:
        status = STATUS_OF_CLASS.get(cls)
        if status is not None:
            return status
    raise LookupError(f"expected an error the server answers, got {error!r}")
