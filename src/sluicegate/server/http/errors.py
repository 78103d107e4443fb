"""Every error the server answers, and the one table from an error to its answer.

The core's tree (``core/errors.py``: ``RequestError``, ``EngineError`` and their
subclasses) is shared with the engines and the client, and knows no HTTP. This
module adds the errors only the server raises, and ``KINDS``: each error class
with the status, the OpenAI error ``type`` and the default ``code`` it is
answered with.

::

    SluicegateError
    ├── RequestError (core)       400 invalid_request_error
    │   ├── ModelNotFound (core)  404 model_not_found
    │   ├── BodyTooLarge (core)   413 request_too_large
    │   ├── UnsupportedMediaType  415 unsupported_media_type, _content_encoding
    │   ├── NotFound              404 not_found: a stored response or a resumable
    │   │                         stream that is unknown, another key's or expired
    │   ├── Conflict              409, its own code (a finished stream's cancel):
    │   │                         IdempotencyConflict, ProducedElsewhere
    │   ├── RouteNotFound         404, MethodNotAllowed 405: Starlette's routing
    │   ├── RequestTimeout        408 request_timeout: a head or body arrived late
    │   └── HeadTooLarge          431 request_header_too_large
    ├── AdmissionError            400 (refused before any work)
    │   ├── Unauthenticated       401 missing_api_key, invalid_api_key, ...
    │   ├── Forbidden             403 model_not_allowed, admin_key_required, ...
    │   ├── HostNotAllowed        421 host_not_allowed
    │   ├── OverQuota             429 rate_limit_error
    │   └── Unavailable           503 server_error (draining, a full queue, ...)
    ├── EngineError (core)        500 server_error engine_error
    │   ├── EngineUnavailable     503 engine_unavailable
    │   └── EngineRefused         its own status (an upstream's), else its row's
    │       ├── UpstreamFailed    502; UpstreamTimedOut 504; UpstreamsBusy 503
    ├── StoreError                503 resume_store_unavailable
    │   ├── StoreFull             503 resume_store_full
    │   ├── RedisUnavailable      (as StoreError); RedisFull (as StoreFull)
    │   ├── LogNotFound           404 not_found
    │   ├── CursorEvicted         410 cursor_evicted
    │   └── ProducerLost          503 resume_store_unavailable
    ├── TooManyConnections        503 too_many_connections
    ├── ResponseFailed            500: a stored response that ended failed
    └── InternalError             500 internal_error: a bug (details in the log)

``kind_of`` reads the table (a class not listed takes its nearest listed
base's row); ``answers.error_answer`` writes one error in each API's shape,
before the first byte. After it an error is in band: a ``Fail`` whose ``code``
the API's stream machine frames; ``STATUS_OF_CODE`` gives the status of a
non-streamed response that a ``Fail`` ended.

Invariants:
    - No answer elsewhere in ``server/`` writes an error status by hand: each
      raises (or answers) an error of this table (``tests/server/test_errors.py``).
    - A store's own text names hosts and ports: it goes to the log; the client
      gets the fixed message of its code (``store_refusal_message``).

Deliberate divergence: exceptions that never reach a client stay private to
the module that raises and catches them (a writer's give-up, a schema breach).

Spec: docs/DESIGN.md, "Status first, errors in band"; OpenAI API reference,
"Error codes"; Anthropic API reference, "Errors".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sluicegate.core.errors import (
    BodyTooLarge,
    EngineError,
    EngineUnavailable,
    ModelNotFound,
    RequestError,
    SluicegateError,
    UnsupportedMediaType,
    UpstreamFailed,
    UpstreamTimedOut,
)

__all__ = [
    "CLIENT_CLOSED",
    "FIRST_TOKEN_TIMEOUT",
    "INTERNAL_ERROR",
    "KINDS",
    "REQUEST_TIMEOUT",
    "SERVER_SHUTDOWN",
    "STATUS_OF_CODE",
    "STORE_FULL",
    "STORE_LOST",
    "STORE_UNAVAILABLE",
    "AdmissionError",
    "Conflict",
    "CursorEvicted",
    "ErrorKind",
    "Forbidden",
    "HeadTooLarge",
    "HostNotAllowed",
    "IdempotencyConflict",
    "InternalError",
    "LogNotFound",
    "MethodNotAllowed",
    "NotFound",
    "OverQuota",
    "ProducedElsewhere",
    "ProducerLost",
    "RedisFull",
    "RedisUnavailable",
    "RequestTimeout",
    "ResponseFailed",
    "RouteNotFound",
    "StoreError",
    "StoreFull",
    "TooManyConnections",
    "Unauthenticated",
    "Unavailable",
    "kind_of",
    "store_error_code",
    "store_refusal_message",
]

CLIENT_CLOSED = 499
"""The status recorded for a client gone before any status (nginx's; never sent)."""

FIRST_TOKEN_TIMEOUT = "first_token_timeout"
"""Error code: no token within ``StreamLimits.first_token_timeout_s``."""

REQUEST_TIMEOUT = "request_timeout"
"""Error code: the response did not end within ``StreamLimits.request_timeout_s``."""

SERVER_SHUTDOWN = "server_shutdown"
"""Error code: the server's shutdown grace period ran out (see ``shutdown.py``)."""

INTERNAL_ERROR = "internal_error"
"""``code`` of a bug: the details stay in the server's log."""

STORE_FULL = "resume_store_full"
"""Error code (503 before the first byte, in band after it) of ``StoreFull``."""

STORE_UNAVAILABLE = "resume_store_unavailable"
"""Error code of any other failure of a shared store (``StoreError``)."""

STORE_LOST = "The store of this resumable stream failed; the stream cannot go on"
"""The message of the in-band error that ends a stream whose store failed (the
store's own text names hosts: it goes to the log, not to the client)."""


@dataclass(frozen=True, slots=True)
class ErrorKind:
    """How one class of error is answered.

    Attributes:
        status: the HTTP status before the first byte (400-599).
        error_type: the OpenAI ``type`` (Messages: by status, ``messages_bodies.py``).
        code: the ``code`` of an error that carries none of its own.
    """

    status: int
    error_type: str
    code: str | None = None


class AdmissionError(SluicegateError):
    """A request refused before the first byte (401, 403, 421, 429 or 503).

    Attributes:
        message: human-readable; never contains the key or the prompt.
        code: OpenAI error ``code``.
        retry_after_s: whole seconds for ``Retry-After`` (429/503), else ``None``.
    """

    def __init__(self, message: str, code: str, retry_after_s: int | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.retry_after_s = retry_after_s


class Unauthenticated(AdmissionError):
    """No API key, or one this server does not know (401)."""


class Forbidden(AdmissionError):
    """A known key without access to the requested model or route (403)."""


class HostNotAllowed(AdmissionError):
    """A keyless route asked for under a ``Host`` name it does not serve (421)."""


class OverQuota(AdmissionError):
    """The key's requests/minute or tokens/minute bucket is empty (429).

    Attributes:
        tokens_only: only the tokens/minute bucket is short, so the wait depends
            on how many tokens were asked for (a floor asked for less than the
            plan will reserve gets a wait that is a lower bound).
    """

    tokens_only: bool = False


class Unavailable(AdmissionError):
    """The server is draining or overloaded, or a shared store failed (503)."""


class StoreError(SluicegateError):
    """A resumable log cannot be read or written as asked."""


class LogNotFound(StoreError):
    """No log with that id readable by that owner (unknown, another key's, expired)."""


class CursorEvicted(StoreError):
    """The frames after the cursor were dropped to keep the log within its bound."""


class ProducerLost(StoreError):
    """The log's producer stopped leasing before it finished (its replica died)."""


class StoreFull(StoreError):
    """No room for a new log: live logs fill the bound (or the shared store)."""


class RedisUnavailable(StoreError):
    """Redis cannot be reached, or answered with an error (503, or in band)."""


class RedisFull(RedisUnavailable, StoreFull):
    """Redis refused a write: its memory is at ``maxmemory`` (``noeviction``);
    answered as a ``StoreFull`` (``resume_store_full``, 503 or in band)."""


class Conflict(RequestError):
    """A request at odds with the state of what it names (409; its own code)."""


class IdempotencyConflict(Conflict):
    """An idempotency key reused with another request body."""


class NotFound(RequestError):
    """A stored response or resumable stream that is unknown, another key's, or
    expired: one answer for all three, so ids cannot be probed (404)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="not_found")


class RouteNotFound(RequestError):
    """No route at that path (404, from Starlette's router)."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"Invalid URL ({method} {path})")


class MethodNotAllowed(RequestError):
    """A route asked for with a method it does not take (405)."""

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"Method {method} is not allowed for {path}")


class ProducedElsewhere(Conflict):
    """A stored response that another replica still produces."""

    def __init__(self, response_id: str) -> None:
        super().__init__(
            f"Response '{response_id}' is being generated by another server"
            " replica; retry there, or wait for it to end",
            code="produced_elsewhere",
        )


class RequestTimeout(RequestError):
    """A request's head or body did not arrive in time (408)."""

    def __init__(self, part: str, timeout_s: float) -> None:
        super().__init__(
            f"The request {part} did not arrive within {timeout_s:g} s",
            code="request_timeout",
        )


class HeadTooLarge(RequestError):
    """A request head (request line and headers) over the limit (431)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(
            "The request head (request line and headers) is larger than "
            f"{limit_bytes} bytes",
            code="request_header_too_large",
        )


class TooManyConnections(SluicegateError):
    """A request on a connection past the server's cap (503, ``Retry-After``)."""

    def __init__(self, cap: int) -> None:
        super().__init__(
            f"The server serves at most {cap} connections at once, and that "
            "many are open; retry later"
        )


class ResponseFailed(SluicegateError):
    """A stored response, answered whole, that ended failed (500).

    Attributes:
        code: the code of the error it ended with.
    """

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class InternalError(SluicegateError):
    """A bug: an exception no route caught (500; the details go to the log)."""

    message: ClassVar[str] = "The server failed while handling this request"

    def __init__(self) -> None:
        super().__init__(self.message)


_INVALID = "invalid_request_error"
_SERVER = "server_error"

KINDS: dict[type[SluicegateError], ErrorKind] = {
    RequestError: ErrorKind(400, _INVALID),
    ModelNotFound: ErrorKind(404, _INVALID, "model_not_found"),
    NotFound: ErrorKind(404, _INVALID, "not_found"),
    RouteNotFound: ErrorKind(404, _INVALID),
    MethodNotAllowed: ErrorKind(405, _INVALID),
    RequestTimeout: ErrorKind(408, _INVALID, "request_timeout"),
    Conflict: ErrorKind(409, _INVALID),
    BodyTooLarge: ErrorKind(413, _INVALID, "request_too_large"),
    UnsupportedMediaType: ErrorKind(415, _INVALID, "unsupported_media_type"),
    HeadTooLarge: ErrorKind(431, _INVALID, "request_header_too_large"),
    AdmissionError: ErrorKind(400, _INVALID),
    Unauthenticated: ErrorKind(401, _INVALID),
    Forbidden: ErrorKind(403, _INVALID),
    HostNotAllowed: ErrorKind(421, _INVALID, "host_not_allowed"),
    OverQuota: ErrorKind(429, "rate_limit_error"),
    Unavailable: ErrorKind(503, _SERVER),
    EngineError: ErrorKind(500, _SERVER, EngineError.code),
    EngineUnavailable: ErrorKind(503, _SERVER, EngineUnavailable.code),
    UpstreamFailed: ErrorKind(502, _SERVER),
    UpstreamTimedOut: ErrorKind(504, _SERVER),
    StoreError: ErrorKind(503, _SERVER, STORE_UNAVAILABLE),
    StoreFull: ErrorKind(503, _SERVER, STORE_FULL),
    LogNotFound: ErrorKind(404, _INVALID, "not_found"),
    CursorEvicted: ErrorKind(410, _INVALID, "cursor_evicted"),
    TooManyConnections: ErrorKind(503, _SERVER, "too_many_connections"),
    ResponseFailed: ErrorKind(500, _SERVER, "server_error"),
    InternalError: ErrorKind(500, _SERVER, INTERNAL_ERROR),
}
"""Error class -> how it is answered; a class not listed takes its nearest
listed base's row. An ``EngineRefused`` keeps the status and type it carries."""

STATUS_OF_CODE: dict[str, int] = {
    EngineUnavailable.code: 503,
    SERVER_SHUTDOWN: 503,
    FIRST_TOKEN_TIMEOUT: 504,
    REQUEST_TIMEOUT: 504,
}
"""``Fail.code`` -> status of a non-streamed response; any other code is a 500."""


def kind_of(cls: type[SluicegateError]) -> ErrorKind:
    """The row of ``KINDS`` that answers ``cls``: its own, else its nearest
    listed base's (method resolution order).

    Raises:
        LookupError: no listed class among its bases (a ``StreamError`` or
            ``ProtocolError``: never answered by the server).
    """
    for base in cls.__mro__:
        kind = KINDS.get(base)
        if kind is not None:
            return kind
    raise LookupError(f"expected an error the server answers, got {cls.__name__}")


def store_error_code(exc: StoreError) -> str:
    """The error code a client gets for ``exc``: ``STORE_FULL`` for a full
    store, ``STORE_UNAVAILABLE`` for any other failure."""
    return STORE_FULL if isinstance(exc, StoreFull) else STORE_UNAVAILABLE


def store_refusal_message(exc: StoreError) -> str:
    """The message of the 503 a client gets for ``exc`` before its first byte.

    Fixed text per error code: the store's own text names its host and port
    (and a driver may quote more of its URL), so it goes to the log only.
    """
    if isinstance(exc, StoreFull):
        return "The resumable-stream store is full; retry later"
    return "The resumable-stream store cannot be reached; retry later"
