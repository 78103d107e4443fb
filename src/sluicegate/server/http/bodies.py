"""Request bodies: JSON only, read with a size limit, decoded as one JSON object.

The ``Content-Type`` must be ``application/json`` (parameters such as
``charset`` allowed), or the body is not read (415): a web page can make a
browser POST ``text/plain`` to any server without asking it first (no CORS
preflight), while ``application/json`` needs the server's consent, which this
server never gives.

The size limit is checked twice: against ``Content-Length`` before reading
anything, and against the bytes actually received while reading (a chunked body
has no ``Content-Length``, and a client may send more than it declared).

Spec: RFC 9110, "15.5.14. 413 Content Too Large" and "15.5.16. 415 Unsupported
Media Type"; WHATWG Fetch, "CORS-safelisted request-header"; OpenAI API
reference, "Error codes".
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request

from sluicegate.core.errors import (
    BodyTooLarge,
    RequestError,
    UnsupportedMediaType,
    bounded_repr,
)

__all__ = ["read_json_object"]


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request body as a JSON object.

    Args:
        request: the incoming request; its body stream is consumed.
        max_bytes: the largest body accepted, in bytes.

    Returns:
        The decoded object (a ``dict`` with ``str`` keys).

    Raises:
        UnsupportedMediaType: 415, no ``Content-Type: application/json``.
        BodyTooLarge: 413, by ``Content-Length`` or by bytes received.
        RequestError: 400 for an invalid ``Content-Length``, a body that is not
            UTF-8 JSON, or JSON that is not an object.
    """
    content_type = request.headers.get("content-type")
    media_type = (content_type or "").partition(";")[0].strip().lower()
    if media_type != "application/json":
        raise UnsupportedMediaType(content_type)
    declared = request.headers.get("content-length")
    if declared is not None:
        # ASCII digits only ("²".isdigit()), and few enough for int() (19 digits
        # is over any body's size already).
        if not (declared.isascii() and declared.isdigit()) or len(declared) > 19:
            raise RequestError(
                f"Invalid Content-Length header: {bounded_repr(declared)}"
            )
        if int(declared) > max_bytes:
            raise BodyTooLarge(max_bytes, int(declared))
    chunks: list[bytes] = []
    seen = 0
    async for chunk in request.stream():
        seen += len(chunk)
        if seen > max_bytes:
            raise BodyTooLarge(max_bytes, seen)
        chunks.append(chunk)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise RequestError(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise RequestError(
            f"The request body must be a JSON object; got {type(body).__name__} "
            f"({_json_kind(body)})",
            code="invalid_json",
        )
    return body


_JSON_KINDS = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _json_kind(value: object) -> str:
    return _JSON_KINDS.get(type(value), type(value).__name__)
