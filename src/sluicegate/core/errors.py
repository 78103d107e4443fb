"""The whole sluicegate exception hierarchy.

::

    SluicegateError
    ├── ProtocolError (abstract; .status_hint, as in h11)
    │   ├── LocalProtocolError   we broke the protocol: a bug, e.g. a frame after [DONE]
    │   └── RemoteProtocolError  the peer did: bad SSE line, bad JSON, bad chunk shape
    ├── RequestError             invalid client request -> 400; carries .param
    │   ├── ModelNotFound        unknown model -> 404
    │   └── BodyTooLarge         request body over the limit -> 413
    ├── EngineError              the engine failed; .retryable
    │   ├── EngineUnavailable    overloaded or shutting down (retryable)
    │   └── EngineTimeout        a time limit ran out (retryable)
    └── StreamError              client API misuse
        ├── StreamConsumed       iterated a response twice
        └── StreamClosed         read after close

Expected outcomes (a stop string matched, a stream finished or was truncated) are
values, not exceptions: see ``StopStep`` and ``EndState``.
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "BodyTooLarge",
    "EngineError",
    "EngineTimeout",
    "EngineUnavailable",
    "LocalProtocolError",
    "ModelNotFound",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestError",
    "SluicegateError",
    "StreamClosed",
    "StreamConsumed",
    "StreamError",
]


class SluicegateError(Exception):
    """Base of every exception sluicegate raises on purpose."""


class ProtocolError(SluicegateError):
    """A violation of the streaming protocol; abstract.

    Attributes:
        status_hint: the HTTP status a server would answer with, as in h11.
    """

    status_hint: int

    def __init__(self, message: str, status_hint: int = 400) -> None:
        if type(self) is ProtocolError:
            raise TypeError("ProtocolError is abstract; raise a subclass")
        super().__init__(message)
        self.status_hint = status_hint


class LocalProtocolError(ProtocolError):
    """We broke the protocol (a bug on our side), e.g. a frame after ``[DONE]``."""

    def __init__(self, message: str, status_hint: int = 500) -> None:
        super().__init__(message, status_hint)


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol: a bad SSE line, bad JSON or a bad chunk shape."""

    def __init__(self, message: str, status_hint: int = 502) -> None:
        super().__init__(message, status_hint)


class RequestError(SluicegateError):
    """An invalid client request, answered before any byte of a stream.

    Attributes:
        param: the request parameter at fault (``None`` for the body as a whole).
        code: a short machine-readable code, or ``None``.
        status: the HTTP status to answer with.
    """

    status: ClassVar[int] = 400
    error_type: ClassVar[str] = "invalid_request_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ModelNotFound(RequestError):
    """The request names a model this server does not serve (404)."""

    status: ClassVar[int] = 404

    def __init__(self, model: str, served: list[str]) -> None:
        super().__init__(
            f"The model {model!r} does not exist; this server serves {served!r}",
            param="model",
            code="model_not_found",
        )


class BodyTooLarge(RequestError):
    """The request body is larger than the configured limit (413)."""

    status: ClassVar[int] = 413

    def __init__(self, limit_bytes: int, seen_bytes: int) -> None:
        super().__init__(
            f"The request body has {seen_bytes} bytes; the limit is {limit_bytes}",
            code="request_too_large",
        )


class EngineError(SluicegateError):
    """The engine failed to serve a request.

    Attributes:
        retryable: whether the same request may succeed if sent again.
        code: a short machine-readable code for the in-band error event.
    """

    retryable: ClassVar[bool] = False
    code: ClassVar[str] = "engine_error"


class EngineUnavailable(EngineError):
    """The engine is overloaded or shutting down."""

    retryable: ClassVar[bool] = True
    code: ClassVar[str] = "engine_unavailable"


class EngineTimeout(EngineError):
    """A time limit (time to first token, total time) ran out."""

    retryable: ClassVar[bool] = True
    code: ClassVar[str] = "timeout"


class StreamError(SluicegateError):
    """Misuse of a client stream object."""


class StreamConsumed(StreamError):
    """The stream was already iterated; its events cannot be read twice."""

    def __init__(self) -> None:
        super().__init__("This stream has already been consumed")


class StreamClosed(StreamError):
    """The stream was read after it was closed."""

    def __init__(self) -> None:
        super().__init__("This stream is closed")
