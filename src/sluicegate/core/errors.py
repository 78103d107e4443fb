"""The whole sluicegate exception hierarchy.

::

    SluicegateError
    ├── ProtocolError (abstract; .status_hint, as in h11)
    │   ├── LocalProtocolError   we broke the protocol: a bug, e.g. a frame after [DONE]
    │   └── RemoteProtocolError  the peer did: bad SSE line, bad JSON, bad chunk shape
    ├── RequestError             invalid client request -> 400; carries .param
    │   ├── ModelNotFound        unknown model -> 404
    │   ├── BodyTooLarge         request body over the limit, decoded or not -> 413
    │   └── UnsupportedMediaType not application/json, or a coding not decoded -> 415
    ├── EngineError              the engine failed; .retryable
    │   ├── EngineUnavailable    overloaded or shutting down (retryable)
    │   ├── EngineCrashed        the engine process died mid-request (retryable)
    │   ├── EngineTimeout        a time limit ran out (retryable)
    │   ├── UpstreamProtocolError an upstream's stream broke the protocol or a bound
    │   └── EngineRefused        refused before any output, with its own status
    │       ├── UpstreamFailed   no upstream answered usably before any content
    │       ├── UpstreamsBusy    no upstream could take it (an EngineUnavailable)
    │       └── UpstreamTimedOut an upstream's time ran out before any content
    └── StreamError              client API misuse
        ├── StreamConsumed       iterated a response twice
        └── StreamClosed         read after close

Expected outcomes (a stop string matched, a stream finished or was truncated) are
values, not exceptions: see ``StopStep`` and ``EndState``.

A message that echoes what a client sent builds the echo with ``bounded_repr``: a
client's value may be megabytes long or nested deeper than ``repr`` can recurse.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar

__all__ = [
    "REPR_MAX_CHARS",
    "REPR_MAX_DEPTH",
    "BodyTooLarge",
    "EngineCrashed",
    "EngineError",
    "EngineRefused",
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
    "UnsupportedMediaType",
    "UpstreamFailed",
    "UpstreamProtocolError",
    "UpstreamTimedOut",
    "UpstreamsBusy",
    "bounded_repr",
]

_INDEX = re.compile(r"\[(\d+)\]")
_FIRST_INDEXED = re.compile(r"[^.\[]+\[\d+\]")  # messages[3] of messages[3].role

REPR_MAX_CHARS = 200
"""Most characters of a client's value that an error message echoes."""

REPR_MAX_DEPTH = 4
"""Most levels of nested arrays and objects that an error message echoes."""


def bounded_repr(
    value: object, max_chars: int = REPR_MAX_CHARS, max_depth: int = REPR_MAX_DEPTH
) -> str:
    """``repr(value)`` cut to ``max_chars`` characters and ``max_depth`` levels.

    For the "got ..." of an error message: what a client sent may be megabytes long,
    or (JSON parsers allow 1,024 levels) nested deeper than ``repr`` can recurse.

    Args:
        value: anything; JSON values (``dict``, ``list``, ``str``, ``int``,
            ``float``, ``bool``, ``None``) are shown item by item.
        max_chars: the longest result (characters, >= 3).
        max_depth: levels of lists, tuples and dicts shown; a deeper non-empty
            one is shown as ``[...]``, ``(...)`` or ``{...}``.

    Returns:
        ``repr(value)`` when it fits both limits. Otherwise the repr of what fits,
        cut to ``max_chars - 3`` characters and ended with ``"..."``. Containers
        keep their order; an integer too long to print is shown by its size.
        The work done is bounded by ``max_chars`` and ``max_depth``, not by the
        size of ``value``.
    """
    parts: list[str] = []
    _echo(value, max_depth, parts, max_chars + 1)
    text = "".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def _echo(value: object, depth: int, parts: list[str], room: int) -> int:
    """Append the repr of ``value`` to ``parts`` until ``room`` runs out; the rest."""
    if room <= 0:
        return room
    if isinstance(value, list | tuple | dict):
        opening, closing = "[]" if isinstance(value, list) else "()"
        if isinstance(value, dict):
            opening, closing = "{}"
        if depth <= 0 and value:
            parts.append(f"{opening}...{closing}")
            return room - 5
        parts.append(opening)
        room -= 1
        items = value.items() if isinstance(value, dict) else value
        for i, item in enumerate(items):
            if room <= 0:
                return room
            if i:
                parts.append(", ")
                room -= 2
            if isinstance(value, dict):
                room = _echo(item[0], depth - 1, parts, room)
                parts.append(": ")
                room = _echo(item[1], depth - 1, parts, room - 2)
            else:
                room = _echo(item, depth - 1, parts, room)
        if isinstance(value, tuple) and len(value) == 1:
            parts.append(",")
            room -= 1
        parts.append(closing)
        return room - 1
    if isinstance(value, str):
        piece = repr(value[:room])  # never more of a long string than can show
    elif isinstance(value, int) and value.bit_length() > 3 * room:
        # More digits than room (or than int -> str converts at all).
        piece = f"<an integer of {value.bit_length()} bits>"
    else:
        piece = repr(value)
    parts.append(piece)
    return room - len(piece)


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

    The HTTP status that answers each one is in ``sluicegate.server.http.errors.KINDS``.

    .. versionchanged:: 0.2.0
       No ``status`` attribute: one table in the server maps errors to statuses.
    """

    error_type: ClassVar[str] = "invalid_request_error"

    def __init__(
        self, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def rename_params(self, names: Mapping[str, str]) -> None:
        """Name another API's parameters instead of chat's (in place): ``param``
        and the message's mentions of it. ``names`` maps a chat parameter to
        that API's (``{"max_tokens": "max_output_tokens"}``); a ``param`` under
        a mapped one (``messages[2].content``) becomes the mapped name alone.
        A name with ``[]`` maps that path whatever its indices, which carry
        over in order (``{"tools[].function.parameters": "tools[].input_schema"}``
        renames ``tools[3].function.parameters`` to ``tools[3].input_schema``);
        one with an index maps that element (``{"messages[2]": "input[1]"}``)."""
        param = self.param
        if param is None:
            return
        first = _FIRST_INDEXED.match(param)
        if first is not None and first.group() in names:
            element = names[first.group()]
            self.param = element + param[first.end() :]
            self.message = self.message.replace(first.group(), element)
            self.args = (self.message,)
            return
        indices = _INDEX.findall(param)
        template = names.get(_INDEX.sub("[]", param)) if indices else None
        if template is not None:
            parts = template.split("[]")
            indexed = parts[0] + "".join(
                f"[{i}]{part}" for i, part in zip(indices, parts[1:], strict=False)
            )
            self.param = indexed
            self.message = self.message.replace(param, indexed)
            self.args = (self.message,)
            return
        head = param.split("[", 1)[0].split(".", 1)[0]
        new = names.get(head)
        if new is None:
            return
        self.param = new
        message = self.message.replace(f"'{head}'", f"'{new}'")
        if message.startswith(head + " "):
            message = new + message[len(head) :]
        self.message = message
        self.args = (message,)


class ModelNotFound(RequestError):
    """The request names a model this server does not serve (404)."""

    def __init__(self, model: str, served: list[str]) -> None:
        super().__init__(
            f"The model {bounded_repr(model)} does not exist; this server serves "
            f"{served!r}",
            param="model",
            code="model_not_found",
        )


class BodyTooLarge(RequestError):
    """The request body (received, or decoded from a ``coding``) is over the limit."""

    def __init__(self, limit_bytes: int, seen_bytes: int, coding: str = "") -> None:
        has = f"decodes ({coding}) to more than" if coding else "has"
        super().__init__(
            f"The request body {has} {seen_bytes} bytes; the limit is {limit_bytes}",
            code="request_too_large",
        )


class UnsupportedMediaType(RequestError):
    """A request body whose ``Content-Type`` is not ``application/json``, or in
    a content ``coding`` (its ``Content-Encoding``) not decoded here (415)."""

    def __init__(self, content_type: str | None, coding: str | None = None) -> None:
        seen = "none" if content_type is None else bounded_repr(content_type)
        wanted, code = "'Content-Type: application/json'", "unsupported_media_type"
        if coding is not None:
            seen, wanted = bounded_repr(coding), "gzip, deflate or identity"
            code = "unsupported_content_encoding"
        super().__init__(
            f"The request body must be sent as {wanted}; got {seen}", code=code
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


class EngineCrashed(EngineError):
    """The engine process died (a native crash, a kill) while the request ran;
    the supervisor restarts it."""

    retryable: ClassVar[bool] = True
    code: ClassVar[str] = "engine_crashed"


class EngineTimeout(EngineError):
    """A time limit (time to first token, total time) ran out."""

    retryable: ClassVar[bool] = True
    code: ClassVar[str] = "timeout"


class UpstreamProtocolError(EngineError):
    """An upstream's stream broke the protocol or one of the reader's bounds
    (``core/upstream/limits.py``), after content: its in-band error's code."""

    code: ClassVar[str] = "upstream_protocol_error"


class EngineRefused(EngineError):
    """The engine refused a request before any output, with a status of its own.

    An upstream server answers some requests with a status instead of a stream:
    a 429 or 503 with ``Retry-After``, a 400 for a prompt over its context
    window. Raised before the response's first byte, it becomes that response's
    status and an error body carrying ``message``. A refusal of the gateway's
    own (a subclass) gives no status: its class's row in the server's error
    table (``server/http/errors.py``, ``KINDS``) has it.

    Attributes:
        status: the HTTP status to answer with (400-599), or ``None`` for the
            status of the class's row.
        retry_after_s: seconds the client should wait (``Retry-After``), or ``None``.
        error_type: the OpenAI error type of the body (``invalid_request_error``
            for a 4xx, ``server_error`` otherwise, unless the engine says), or
            ``None`` for the type of the class's row.
        error_code: the body's machine-readable code (the upstream's own), or
            ``None``.
        param: the request parameter at fault, or ``None``.
    """

    code: ClassVar[str] = "engine_refused"

    def __init__(
        self,
        message: str,
        status: int | None = None,
        *,
        retry_after_s: float | None = None,
        error_type: str | None = None,
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None and not 400 <= status <= 599:
            raise ValueError(f"expected an error status (400-599), got {status}")
        if status is not None and error_type is None:
            error_type = "invalid_request_error" if status < 500 else "server_error"
        self.status = status
        self.retry_after_s = retry_after_s
        self.error_type = error_type
        self.error_code = code
        self.param = param


class UpstreamFailed(EngineRefused):
    """No upstream answered usably before any content: its 200's stream failed
    first, or its answer was not HTTP (the server's 502)."""


class UpstreamsBusy(EngineRefused, EngineUnavailable):
    """No upstream of the pool could take the request: none healthy, all busy
    with the queue full, or none free in time: an engine unavailable (the
    server's 503), with the pool's ``retry_after_s``."""


class UpstreamTimedOut(EngineRefused):
    """An upstream's time limit ran out before its first content (the server's
    504)."""


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
